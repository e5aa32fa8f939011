"""Actor fairness on shared cores: two identical actors of one job should step at the same rate.

    mpirl bench fairness [--reps 5]

The default CartPole job (``jobs/cartpole.toml``) on 4 ranks (learner, buffer, two
actors; this machine's cores shared by all four), with ``apex.epsilon_alpha = 0``
so both actors explore with the same epsilon, for 30 s of each actor's rows after
the warm-up: start-up and the replay's fill, i.e. the rows from the learner's first
row with training on. The job runs until both actors' rows span that long, however
long this machine takes, then stops cleanly. Each actor's env steps/s comes from the
buffer's ``actors`` table (the counts the actor reports in its messages); the figure
is the faster actor's rate over the slower one's, one job per repetition. Ape-X's spread of epsilons only
means something if actors with different epsilons do step alike.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import h5py
import numpy as np

from mpirl.bench.report import MIN_REPS, Row
from mpirl.bench.run_mpi import run_job_until, spanned

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "cartpole.toml"
DEADLINE = 600.0  # the job's own wall-time limit: a backstop, it is stopped once its rows are in


def actor_rows(run_dir: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per actor the (times, env steps) of its rows from the learner's first row with training on; {} before.

    Reads the files while the job may still write them (no lock)."""
    with h5py.File(run_dir / "learner.h5", "r", locking=False) as f:
        lt, ls = f["train/time"][()], f["train/train_steps"][()]
    n = min(len(lt), len(ls))  # a row being appended: not all its columns may be there yet
    trained = lt[:n][ls[:n] > 0]
    if not len(trained):
        return {}
    start = float(trained[0])
    with h5py.File(run_dir / "buffer_1.h5", "r", locking=False) as f:
        actors = [int(a) for a in f.attrs["actors"]]
        a = f["actors"]
        t, who, steps = a["time"][()], a["actor"][()], a["env_steps"][()]
    n = min(len(t), len(who), len(steps))
    t, who, steps = t[:n], who[:n], steps[:n]
    return {actor: (t[(who == actor) & (t >= start)], steps[(who == actor) & (t >= start)]) for actor in actors}


def rates(run_dir: Path, seconds: float) -> list[float]:
    """Each actor's env steps/s between its first row after the warm-up and its last."""
    rows = actor_rows(run_dir)
    if not spanned(rows, seconds):
        spans = {a: f"{len(ts)} rows over {ts[-1] - ts[0] if len(ts) > 1 else 0:.1f} s" for a, (ts, _) in rows.items()}
        raise RuntimeError(f"{run_dir}: the job ended before both actors' rows after the learner's first train step "
                           f"spanned {seconds:g} s ({spans or 'no row with training'})")
    return [float((st[-1] - st[0]) / (ts[-1] - ts[0])) for ts, st in rows.values()]


def one(seed: int, seconds: float, out: Path) -> list[float]:
    sets = [f"run.seed={seed}", "apex.epsilon_alpha=0", f"run.wall_seconds={DEADLINE:g}",
            "run.target_return=nan", "run.env_steps=0"]
    run_dir = run_job_until(4, str(JOB), sets, out, f"fair-s{seed}", lambda d: spanned(actor_rows(d), seconds),
                            DEADLINE + 180, "fairness")
    return rates(run_dir, seconds)


def run(reps: int = MIN_REPS, seconds: float = 30.0) -> list[Row]:
    r = Row("two identical CartPole actors, 4 ranks on this machine's cores: faster / slower", "ratio",
            "faster actor / slower actor", "equal rates", higher_is_better=False, at_most=1.5,
            note=f"jobs/cartpole.toml, apex.epsilon_alpha = 0, {seconds:g} s of each actor's rows after the "
                 "learner's first train step, one job per repetition")
    steps = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            fast, slow = sorted(one(rep + 1, seconds, Path(tmp)), reverse=True)[:2]
            r.values.setdefault(r.ours, []).append(fast / slow)
            steps.append(fast + slow)
    r.values[r.reference] = [1.0] * reps
    r.note += f"; both actors together: median {np.median(steps):,.0f} env steps/s"
    return [r]
