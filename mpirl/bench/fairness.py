"""Actor fairness on shared cores: two identical actors of one job should step at the same rate.

    mpirl bench fairness [--reps 5]

The default CartPole job (``jobs/cartpole.toml``) on 4 ranks (learner, buffer, two
actors; this machine's cores shared by all four), with ``agent.epsilon_alpha = 0``
so both actors explore with the same epsilon, for 30 s of wall time after a 5 s
warm-up. Each actor's env steps/s comes from the buffer's ``actors`` table (the
counts the actor reports in its messages); the figure is the faster actor's rate
over the slower one's, one job per repetition. Ape-X's spread of epsilons only
means something if actors with different epsilons do step alike.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import h5py
import numpy as np

from mpirl.bench.report import MIN_REPS, Row
from mpirl.bench.run_mpi import run_job

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "cartpole.toml"
WARM = 5.0


def rates(run_dir: Path) -> list[float]:
    """Each actor's env steps/s between its first row after the warm-up and its last."""
    with h5py.File(run_dir / "buffer_1.h5", "r") as f:
        a = f["actors"]
        t, who, steps = a["time"][()], a["actor"][()], a["env_steps"][()]
    out = []
    for actor in np.unique(who):
        keep = (who == actor) & (t >= WARM)
        if keep.sum() < 2:
            raise RuntimeError(f"{run_dir}: actor {actor} has {keep.sum()} rows after {WARM:.0f} s")
        out.append(float((steps[keep][-1] - steps[keep][0]) / (t[keep][-1] - t[keep][0])))
    return out


def one(seed: int, seconds: float, out: Path) -> list[float]:
    sets = [f"run.seed={seed}", "agent.epsilon_alpha=0", f"run.wall_seconds={seconds + WARM}",
            "run.target_return=nan", "run.env_steps=0"]
    return rates(run_job(4, str(JOB), sets, out, f"fair-s{seed}", seconds + 180, "fairness"))


def run(reps: int = MIN_REPS, seconds: float = 30.0) -> list[Row]:
    r = Row("two identical CartPole actors, 4 ranks on this machine's cores: faster / slower", "ratio",
            "faster actor / slower actor", "equal rates", higher_is_better=False, at_most=1.5,
            note=f"jobs/cartpole.toml, agent.epsilon_alpha = 0, {seconds:g} s after a {WARM:g} s warm-up, "
                 "one job per repetition")
    steps = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            fast, slow = sorted(one(rep + 1, seconds, Path(tmp)), reverse=True)[:2]
            r.values.setdefault(r.ours, []).append(fast / slow)
            steps.append(fast + slow)
    r.values[r.reference] = [1.0] * reps
    r.note += f"; both actors together: median {np.median(steps):,.0f} env steps/s"
    return [r]
