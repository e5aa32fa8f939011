"""MinAtar Breakout learns through every role (a learning run, marked ``learning``: about a minute here).

In a file of its own so that the two xdist workers share the learning runs (they take whole files).
"""

import subprocess
import sys

import h5py
import pytest

from mpirl.metrics.summary import summarize

from conftest import ROOT, run_mpi


MINATAR_TARGET = 2.0  # mean return of the last 20 episodes: 5x uniform random play (about 0.4)


@pytest.mark.learning
@pytest.mark.mpi
def test_minatar_breakout_learns_through_every_role_on_4_ranks(tmp_path):
    """MinAtar through the whole path (its boolean 10x10 planes from the actors' games, through the buffer's
    replay, to the learner's network and back as parameters): every rank exits 0 once the returns reach
    MINATAR_TARGET (here within about 20,000 env steps, under a minute), far above random play."""
    job = run_mpi(4, tmp_path, f"run.target_return={MINATAR_TARGET}", "run.env_steps=300_000",
                  "run.wall_seconds=0", job=ROOT / "jobs" / "minatar_breakout.toml", timeout=3600, stall=300)
    assert job.proc.returncode == 0, job.output
    s = summarize(job.run_dir)
    assert f"reached {MINATAR_TARGET:g}" in (s["stop_reason"] or ""), (
        f"did not reach mean return {MINATAR_TARGET} within 300,000 env steps: stopped by {s['stop_reason']!r}, "
        f"last-20 mean {s['episodes']['last20_mean']:.2f}")
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed", dict(f.attrs)
    proc = subprocess.run([sys.executable, "analysis/random_play.py", "jobs/minatar_breakout.toml", "--episodes", "100",
                           "--runs", str(job.run_dir)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    row = next(line.split() for line in proc.stdout.splitlines() if line.strip().startswith("all actors"))
    assert float(row[-1]) > 3, proc.stdout  # z against random play
