"""The job-wide counter of DD-PPO's preemption (:mod:`mpirl.comm.counter`): atomic adds from every rank, and
adds and reads that complete while the root runs pure Python (passive-target progress), under mpiexec."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, run_mpi_script
from mpirl.comm.counter import finished_in_round

JOB = ROOT / "tests" / "counter_job.py"
ADDS = 100  # tests/counter_job.py


@pytest.mark.parametrize("count, round_, workers, finished", [
    (0, 0, 4, 0), (3, 0, 4, 3), (4, 0, 4, 4), (6, 0, 4, 4),  # round 0; a count ahead is capped at W
    (4, 1, 4, 0), (7, 1, 4, 3), (8, 1, 4, 4),  # round 1 starts at W
    (5, 2, 4, 0),  # behind the round: none, never negative
    (23, 5, 4, 3), (0, 0, 1, 0), (1, 0, 1, 1), (9, 0, 1, 1),
])
def test_finished_in_round_counts_the_round_s_workers_from_the_cumulative_count(count, round_, workers, finished):
    assert finished_in_round(count, round_, workers) == finished


@pytest.mark.mpi
def test_adds_from_four_ranks_are_atomic(tmp_path):
    """4 ranks add 1 a hundred times each: every rank then reads 400, and the values before the adds, over all
    ranks, are 0 .. 399, each once (no add lost, none seen twice)."""
    out = tmp_path / "sum.json"
    code, output = run_mpi_script(4, JOB, "sum", str(out), str(tmp_path), timeout=120)
    assert code == 0, output
    ranks = json.loads(out.read_text())
    assert [r["read"] for r in ranks] == [4 * ADDS] * 4, ranks
    before = [v for r in ranks for v in r["before"]]
    assert sorted(before) == list(range(4 * ADDS))
    assert all(r["before"] == sorted(r["before"]) for r in ranks)  # each rank's own adds in order


@pytest.mark.mpi
@pytest.mark.parametrize("mca", [{}, {"OMPI_MCA_osc": "rdma", "OMPI_MCA_btl": "tcp,self"}], ids=["default", "rdma-tcp"])
def test_adds_and_reads_complete_while_the_root_runs_pure_python(tmp_path, monkeypatch, mca):
    """The root spins in Python (no MPI call) until the 3 others have each added 100 and read all 300 (it learns
    that from their files, not from MPI): it ends because they did, and every one of them was done after the root
    started spinning and before it stopped. Also with Open MPI's osc rdma over TCP (the window's memory is shared
    on one node). The order of events is checked, never a time."""
    for key, value in mca.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "progress.json"
    code, output = run_mpi_script(4, JOB, "progress", str(out), str(tmp_path), timeout=120)
    assert code == 0, output
    root, *workers = json.loads(out.read_text())
    assert root["ended_by"] == "flags", (root, workers)  # not the 30 s cap: the others got through without it
    for w in workers:
        assert root["start"] <= w["seen_busy"] <= w["added"] <= w["done"] < root["end"], (root, w)
        assert w["read"] == 3 * ADDS, w
    assert root["read"] == 3 * ADDS
    assert sorted(v for w in workers for v in w["before"]) == list(range(3 * ADDS))
