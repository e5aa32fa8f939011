"""A receive pool under mpiexec: the byte counts it reports are each message's own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, mpi_env, mpiexec
from mpirl.launcher import launch_env

pytestmark = pytest.mark.mpi


def test_a_receive_pool_counts_each_messages_bytes_when_a_later_receive_completes_first(tmp_path):
    out = tmp_path / "pool.json"
    cmd = [mpiexec(), "-n", "4", *launch_env(mpiexec())[0], sys.executable, str(ROOT / "tests" / "pools_job.py"),
           str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env(), cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["got"] == {"1": 10, "2": 20, "3": 30}
    assert result["bytes_received"] == 60 and result["messages"] == 3
