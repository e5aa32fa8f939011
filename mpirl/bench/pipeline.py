"""Pipeline: the learner's wall time split into compute and waiting for batches, by prefetch depth and link.

    mpirl bench pipeline [--job jobs/breakout_proposed_small.toml] [--seconds 12]

Each setting is a real job (learner, buffer, two actors on this machine) with
``comm.prefetch`` 0, 1 or 2 and the buffer <-> learner link unshaped, shaped as
25 Gbit/s + 0.05 ms (25 GbE over 10 km of fibre, the paper's) or as a
1 Gbit/s + 20 ms WAN. The learner's HDF5 rows give compute and communication
seconds (communication: polling, sleeping until a batch is in, taking it,
sending requests and parameters). Only rows after the learner's first train
steps count (the warm-up fill is excluded); the repetitions are the log
intervals of that window (one second each), so the median and min-max are over
at least five intervals of one run per setting. Each job runs until its learner
has logged ``seconds`` such intervals (and at least ``reps``), however long this
machine takes to get there, then stops cleanly.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import h5py
import numpy as np

from mpirl.bench.report import MIN_REPS, Row
from mpirl.bench.run_mpi import run_job_until

LINKS = [("none", 0.0, 0.0), ("25 Gbit/s + 0.05 ms", 25.0, 0.05), ("1 Gbit/s + 20 ms", 1.0, 20.0)]
ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 1.0  # seconds of a learner row (log.interval): one repetition
DEADLINE = 600.0  # a job's own wall-time limit: a backstop, it is stopped once its rows are in


def default_job() -> str:
    try:
        import ale_py  # noqa: F401
        return str(ROOT / "jobs" / "breakout_proposed_small.toml")
    except ImportError:
        return str(ROOT / "jobs" / "cartpole.toml")


def intervals(run_dir: Path) -> list[float]:
    """Communication share of each log interval after the learner's warm-up (percent); reads the learner's file
    while the job may still write it (no lock)."""
    with h5py.File(run_dir / "learner.h5", "r", locking=False) as f:
        t = f["train"]
        steps, comp, comm = t["train_steps"][()], t["compute_s"][()], t["comm_s"][()]
    n = min(len(steps), len(comp), len(comm))  # a row being appended: not all its columns may be there yet
    steps, comp, comm = steps[:n], comp[:n], comm[:n]
    if not (steps > 0).any():
        return []
    start = int(np.argmax(steps > 0)) + 1  # the first full interval with training
    dc, dm = np.diff(comp[start:]), np.diff(comm[start:])
    keep = dc + dm > 0
    return (100 * dm[keep] / (dc[keep] + dm[keep])).tolist()


def shares(run_dir: Path, min_intervals: int) -> list[float]:
    """Communication share of each log interval after the learner's warm-up (percent)."""
    out = intervals(run_dir)
    if len(out) < min_intervals:
        raise RuntimeError(f"{run_dir}: only {len(out)} log intervals with training (need {min_intervals}); "
                           "the job ended before its learner logged them")
    return out


def one(job: str, prefetch: int, gbps: float, ms: float, seconds: float, out: Path, reps: int) -> list[float]:
    need = max(reps, math.ceil(seconds / INTERVAL))
    sets = [f"comm.prefetch={prefetch}", f"comm.link.bandwidth_gbps={gbps}", f"comm.link.latency_ms={ms}",
            "run.env_steps=0", "run.train_steps=0", f"run.wall_seconds={DEADLINE:g}", "run.target_return=nan",
            "replay.capacity=8192", "replay.learning_starts=1000", f"log.interval={INTERVAL:g}"]
    run_dir = run_job_until(4, job, sets, out, f"prefetch{prefetch}", lambda d: len(intervals(d)) >= need,
                            DEADLINE + 240, "pipeline")
    return shares(run_dir, need)


def row(label: str, gbps: float, job: str) -> Row:
    """A link's row: the issue's bound (at most 10 % waiting) is on 25 GbE + 10 km."""
    return Row(f"pipeline learner waiting on communication, link {label}", "% of wall time",
               "prefetch 2", "prefetch 0", higher_is_better=False, at_most=10.0 if gbps == 25.0 else None,
               note=f"{Path(job).name}; the paper measured 27-30 % without overlap")


def run(reps: int = MIN_REPS, seconds: float = 12.0, job: str | None = None, links=LINKS,
        prefetches=(0, 1, 2)) -> list[Row]:
    job = job or default_job()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, gbps, ms in links:
            r = row(label, gbps, job)
            for prefetch in prefetches:
                r.values[f"prefetch {prefetch}"] = one(job, prefetch, gbps, ms, seconds, Path(tmp) / "runs", reps)
            rows.append(r)
    return rows
