"""The random-play level of a job's environment, and whether runs beat it.

    python analysis/random_play.py jobs/breakout_proposed_small.toml --episodes 200
    python analysis/random_play.py jobs/breakout_proposed_small.toml --runs runs/breakout-small-*

Random play is uniform random actions through the same environment the actors
step (same preprocessing, same FIRE after a lost life, same episode ends), so
it is the level a learner must clear to have learned anything. ``--constant``
also plays every fixed action (a network that has learned one habit, such as
"always LEFT" in Breakout, scores that) and reports the best. For each run
the script takes the episodes finished in the last ``--tail`` fraction of the
run, over all actors and per actor, and reports their mean against random
play's with a z score on the difference of means (standard errors combined).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mpirl.config import load  # noqa: E402
from mpirl.envs.vector import make_vector  # noqa: E402


def random_returns(job: str, episodes: int, seed: int, sets=(), action: int | None = None) -> np.ndarray:
    """Returns of ``episodes`` episodes under uniform random actions (or always ``action``)."""
    cfg, _ = load(job, sets)
    envs = make_vector(cfg.env, seed=seed)
    rng = np.random.default_rng(seed)
    envs.reset()
    out, ret = [], np.zeros(envs.num_envs)
    while len(out) < episodes:
        acts = rng.integers(envs.n_actions, size=envs.num_envs) if action is None else np.full(envs.num_envs, action)
        step = envs.step(envs.forced(acts))
        ret += step.reward
        ended = step.terminated | step.truncated
        out.extend(ret[ended].tolist())
        ret[ended] = 0.0
    envs.close()
    return np.asarray(out[:episodes])


def stats(x: np.ndarray) -> tuple[float, float, int]:
    n = len(x)
    return (float(x.mean()) if n else math.nan,
            float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan, n)


def run_episodes(run_dir: Path, tail: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(return, actor, time) of the episodes in the last ``tail`` of the run, all buffers."""
    rets, actors, times = [], [], []
    with h5py.File(run_dir / "run.h5", "r") as f:
        for b in (k for k in f if k.startswith("buffer_")):
            e = f[b]["episodes"]
            rets.append(e["return"][()]), actors.append(e["actor"][()]), times.append(e["time"][()])
    r, a, t = (np.concatenate(x) if x else np.zeros(0) for x in (rets, actors, times))
    if not len(t):
        return r, a, t
    keep = t >= t.max() - tail * (t.max() - t.min())
    return r[keep], a[keep], t[keep]


def z_score(a: tuple, b: tuple) -> float:
    return (a[0] - b[0]) / math.sqrt(a[1] ** 2 + b[1] ** 2) if a[2] > 1 and b[2] > 1 else math.nan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("job")
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--runs", nargs="*", default=[], type=Path)
    ap.add_argument("--tail", type=float, default=0.2, help="fraction of each run's time to compare (default 0.2)")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--constant", action="store_true", help="also play every fixed action; report the best")
    args = ap.parse_args(argv)
    rand = stats(random_returns(args.job, args.episodes, args.seed, args.sets))
    print(f"random play     mean {rand[0]:6.2f} ± {rand[1]:.2f} (s.e.)  over {rand[2]} episodes")
    if args.constant:
        cfg, _ = load(args.job, args.sets)
        probe = make_vector(cfg.env, seed=0)
        n_actions = probe.n_actions
        probe.close()
        fixed = [stats(random_returns(args.job, args.episodes // 4 or 1, args.seed, args.sets, a)) for a in range(n_actions)]
        best = int(np.nanargmax([f[0] for f in fixed]))
        print(f"fixed action    best is action {best}: mean {fixed[best][0]:6.2f} ± {fixed[best][1]:.2f}  "
              f"(all: {', '.join(f'{f[0]:.2f}' for f in fixed)})")
    for run in args.runs:
        r, a, _ = run_episodes(run, args.tail)
        rows = [("all actors", r)] + [(f"actor {int(k)}", r[a == k]) for k in np.unique(a)]
        print(f"{run.name}  (episodes in the last {args.tail:.0%} of the run)")
        for name, x in rows:
            s = stats(x)
            print(f"  {name:12s}  mean {s[0]:6.2f} ± {s[1]:.2f}  n {s[2]:5d}   vs random: "
                  f"{s[0] / rand[0] if rand[0] else math.nan:5.2f}x  z {z_score(s, rand):+6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
