"""A receive pool under mpiexec: the byte counts it reports are each message's own."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, run_mpi_script

pytestmark = pytest.mark.mpi


def test_a_receive_pool_counts_each_messages_bytes_when_a_later_receive_completes_first(tmp_path):
    out = tmp_path / "pool.json"
    code, output = run_mpi_script(4, ROOT / "tests" / "pools_job.py", str(out))
    assert code == 0, output
    result = json.loads(out.read_text())
    assert result["got"] == {"1": 10, "2": 20, "3": 30}
    assert result["bytes_received"] == 60 and result["messages"] == 3
