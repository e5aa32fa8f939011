"""analysis/a3c_exchange.py's measuring functions on a tiny fake run directory (laid out as a gradient-family run:
run.h5 with external links to updates.h5 and worker_<rank>.h5); no MPI."""

from __future__ import annotations

import importlib.util
import math

import h5py
import numpy as np
import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("a3c_exchange", ROOT / "analysis" / "a3c_exchange.py")
ax = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ax)


def fake_run(path, exchange="async", reached=True, delay=(0,), test=None):
    """4 workers (ranks 1-4 under a server, 0-3 under allreduce), 3 rollouts each; the last one slower."""
    path.mkdir(parents=True)
    ranks = range(4) if exchange == "allreduce" else range(1, 5)
    for i, rank in enumerate(ranks):
        slow = i == 3
        with h5py.File(path / f"worker_{rank}.h5", "w") as f:
            f.attrs["worker"] = i
            g = f.create_group("rollouts")
            steps = np.array([16, 4, 16]) if slow else np.array([16, 16, 16])
            g["time"] = np.array([1.0, 2.0, 3.0])
            g["steps"] = steps
            g["env_steps"] = 8 * np.cumsum(steps)
            g["preempted"] = np.array([False, slow, False])
            g["compute_s"] = np.array([0.5, 1.0, 1.8 if slow else 1.5])
            g["wait_s"] = np.array([0.1, 0.2, 0.2 if slow else 0.5])
            g["gradients"] = np.array([1, 2, 3])
            g["dropped"] = np.array([0, 1, 2]) if slow else np.array([0, 0, 0])
    with h5py.File(path / "updates.h5", "w") as f:
        g = f.create_group("updates")
        g["time"] = np.array([1.0, 2.0, 5.0])
        g["version"] = np.array([1, 2, 3])
        g["staleness"] = np.array([0.0, 2.0, 40.0])
        g["applied"] = np.array([True, True, False])
        if test is not None:
            f.create_group("test")["return_mean"] = np.array([test])
    with h5py.File(path / "run.h5", "w") as f:
        f.attrs["status"] = "completed"
        f.attrs["stop_reason"] = ("mean return of the last 20 episodes reached 475" if reached
                                  else "wall_seconds 20 reached")
        f.attrs["wall_seconds"] = 12.5
        job = f.create_group("job")
        job.attrs["a3c.exchange"] = exchange
        job.attrs["run.seed"] = 7
        job.attrs["a3c.worker_delay_us"] = np.array(delay)
        f["updates"] = h5py.ExternalLink("updates.h5", "/")
        for rank in ranks:
            f[f"worker_{rank}"] = h5py.ExternalLink(f"worker_{rank}.h5", "/")
    return path


def test_the_delay_is_the_last_workers_busy_time_per_vector_step(tmp_path):
    run = fake_run(tmp_path / "s7-20260101-000000")
    assert ax.step_delay_us(run) == pytest.approx(1e6 * 1.8 / 36)
    assert [w["worker"] for w in ax.workers(run)] == [0, 1, 2, 3]


def test_an_async_run_measured(tmp_path):
    m = ax.measure(fake_run(tmp_path / "s7-20260101-000000"))
    assert m["seed"] == 7 and m["seconds_to_475"] == 12.5
    assert m["env_steps_to_475"] == 3 * 8 * 48 + 8 * 36
    assert m["updates_s"] == pytest.approx(2 / 4)
    fast, slow = 8 * 32 / 2, 8 * 20 / 2  # rows after the first
    assert m["env_steps_s"] == pytest.approx(3 * fast + slow)
    assert m["slow_ratio"] == pytest.approx(slow / fast)
    assert m["wait_fast"] == pytest.approx(0.5 / 2.0) and m["wait_slow"] == pytest.approx(0.2 / 2.0)
    assert m["dropped"] == pytest.approx(2 / 12)
    assert m["stale_mean"] == pytest.approx(1.0) and m["stale_max"] == 2.0  # the dropped one (40) is not applied
    assert math.isnan(m["preempted"]) and math.isnan(m["test_return"])  # no test round recorded


def test_allreduce_counts_preemptions_and_no_staleness_and_a_missed_target(tmp_path):
    m = ax.measure(fake_run(tmp_path / "s7-20260101-000000", "allreduce", reached=False, delay=(0, 0, 0, 400)))
    assert m["preempted"] == pytest.approx(1 / 12)
    assert math.isnan(m["stale_mean"]) and math.isnan(m["stale_max"])
    assert math.isnan(m["seconds_to_475"]) and math.isnan(m["env_steps_to_475"])
    assert m["delay_us"] == [0, 0, 0, 400]


def test_the_newest_finished_run_of_each_seed_counts(tmp_path):
    fake_run(tmp_path / "s7-20260101-000000")
    fake_run(tmp_path / "s7-20260101-000000-1")
    fake_run(tmp_path / "s17-20250101-000000")
    failed = fake_run(tmp_path / "s7-20270101-000000")
    with h5py.File(failed / "run.h5", "a") as f:
        f.attrs["status"] = "failed"
    runs = ax.newest_runs(tmp_path)
    assert runs == {7: tmp_path / "s7-20260101-000000-1", 17: tmp_path / "s17-20250101-000000"}
    assert ax.newest_runs(tmp_path, [17]) == {17: tmp_path / "s17-20250101-000000"}


def test_the_table_shows_medians_ranges_and_not_reached(tmp_path):
    a = ax.measure(fake_run(tmp_path / "a" / "s1-20260101-000000"))
    b = dict(a, seconds_to_475=20.5)
    missed = ax.measure(fake_run(tmp_path / "b" / "s1-20260101-000000", "allreduce", reached=False))
    text = ax.table({"async-equal": [a, b], "allreduce-slowed": [missed]}, ["async-equal", "allreduce-slowed"])
    equal, slowed = [line for line in text.splitlines() if line.strip().startswith("seconds to 475")]
    assert equal.split()[-2:] == ["16.5", "[12.5,20.5]"]  # the median and the range
    assert slowed.endswith("not reached")
    assert "every run:" in text


def test_the_table_counts_final_policies_that_tested_like_random_play(tmp_path):
    good = ax.measure(fake_run(tmp_path / "a" / "s1-20260101-000000", test=500.0))
    collapsed = ax.measure(fake_run(tmp_path / "b" / "s2-20260101-000000", test=19.6))
    assert (good["test_return"], collapsed["test_return"]) == (500.0, pytest.approx(19.6))
    text = ax.table({"async-equal": [good, collapsed]}, ["async-equal"])
    row = next(line for line in text.splitlines() if line.strip().startswith("final policy's test round"))
    assert row.split()[-2:] == ["259.8", "[19.6,500]"]
    assert "async 2 (0 did not reach 475, 1 tested under 60)" in text
