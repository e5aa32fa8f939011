"""Parameters sent to each member on its own under mpiexec: a member that does not look holds nobody back."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, run_mpi_script

pytestmark = pytest.mark.mpi


def test_parameters_sent_to_each_member_never_wait_for_a_member_that_does_not_look(tmp_path):
    """The root publishes 200 versions and the stop before rank 2 looks once (tests/params_job.py); rank 1 sees
    versions in order, every one whole; rank 2, when it looks, the one on its way and then the newest (the stop)."""
    out = tmp_path / "params.json"
    code, output = run_mpi_script(3, ROOT / "tests" / "params_job.py", str(out), timeout=300)
    assert code == 0, output
    root, fast, slow = json.loads(out.read_text())
    assert root["published"] == 201
    for seen in (fast["seen"], slow["seen"]):
        assert seen and seen == sorted(set(seen)) and -1 not in seen, seen  # in order, none twice, none torn
        assert 1 <= seen[0] and seen[-1] <= 200
    # Rank 2 received the first version (its send started at once) and then only the stop: the 199 versions
    # published while its first was on the way were never sent to it.
    assert slow["seen"] == [1], slow
    assert root["sent"] == len(fast["seen"]) + 1 + len(slow["seen"]) + 1, (root, len(fast["seen"]))
