"""Did a QMIX run learn? Its final greedy round against random play on the same environment.

    python analysis/marl_check.py runs/predator_prey_qmix-*            # one or more run directories

For each run: the last `test` row of learner.h5 (``qmix.test_episodes`` greedy episodes of the final
policy) against as many episodes of uniformly random legal actions on the run's own environment
settings (punishment, predators, episode limit); z is Welch's statistic of the two mean returns, and
the rule the project holds a learning run to is z > 3 and at least twice random play's captures
(where the environment counts captures).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import h5py
import numpy as np

from mpirl import config
from mpirl.algos.qmix.random_play import random_play


def job_of(run_dir: Path) -> config.JobConfig:
    with h5py.File(run_dir / "run.h5", "r", locking=False) as f:
        job = {k: v for k, v in f["job"].attrs.items()}
    cfg = config.JobConfig()
    for key, value in job.items():
        *path, name = key.split(".")
        obj = cfg
        for part in path:
            obj = getattr(obj, part)
        if hasattr(obj, name):
            setattr(obj, name, value.item() if hasattr(value, "item") else value)
    return cfg


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    args = p.parse_args()
    randoms: dict = {}
    print(f"{'run':<34} {'steps':>6} {'wall s':>7} {'greedy return':>15} {'random':>14} {'z':>6} "
          f"{'captures':>9} {'random':>7} {'lone':>6} {'verdict':>8}")
    for run_dir in args.runs:
        with h5py.File(run_dir / "run.h5", "r", locking=False) as f:
            test = {k: f["learner/test"][k][()] for k in ("train_steps", "return_mean", "return_std", "captures",
                                                          "lone_catches", "episodes")}
            wall = float(f.attrs.get("wall_seconds", math.nan))
        if not len(test["train_steps"]):
            print(f"{run_dir.name:<34} no greedy round yet")
            continue
        cfg = job_of(run_dir)
        key = (cfg.env.id, cfg.env.max_episode_steps, str(cfg.env.predator_prey))
        if key not in randoms:
            randoms[key] = random_play(cfg, int(test["episodes"][-1]))
        rnd = randoms[key]
        n = int(test["episodes"][-1])
        mean, std = float(test["return_mean"][-1]), float(test["return_std"][-1])
        se = math.sqrt(std ** 2 / max(n - 1, 1) + rnd["returns"].var(ddof=1) / len(rnd["returns"]))
        z = (mean - rnd["returns"].mean()) / se if se > 0 else math.inf
        counts = rnd["captures"][np.isfinite(rnd["captures"])]
        cap, rcap = float(test["captures"][-1]), float(counts.mean()) if counts.size else math.nan
        counted = np.isfinite(cap) and np.isfinite(rcap)
        ok = z > 3 and (cap >= 2 * rcap if counted else True)
        print(f"{run_dir.name:<34} {int(test['train_steps'][-1]):>6} {wall:>7.0f} {mean:>8.1f} ± {std:<5.1f}"
              f"{rnd['returns'].mean():>7.1f} ± {rnd['returns'].std():<5.1f}{z:>6.1f} {cap:>9.2f} {rcap:>7.2f} "
              f"{float(test['lone_catches'][-1]):>6.1f} {'learned' if ok else 'NOT':>8}")


if __name__ == "__main__":
    main()
