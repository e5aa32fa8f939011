"""Time to solve CartPole with both replay placements, over several seeds, from the HDF5 files.

    python analysis/solve_table.py                       # runs 3 seeds x {proposed, baseline} on 4 ranks
    python analysis/solve_table.py --seeds 1 2 3 4 5 --ranks 6 --set topology.buffers=2
    python analysis/solve_table.py --runs runs/study     # only read runs made earlier

For each run: env steps and wall seconds (since the job's start, from the
learner's rows) until the mean return of the last 20 episodes reached the
target, the learner's compute/communication split, and buffer -> learner bytes
per trained experience. Then the median over seeds per architecture.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def solve_point(run_dir: Path, target: float) -> dict:
    with h5py.File(run_dir / "run.h5", "r") as f:
        t = f["learner/train"]
        ret, time, steps = t["return_mean20"][()], t["time"][()], t["env_steps"][()]
        hit = np.flatnonzero(np.nan_to_num(ret, nan=-np.inf) >= target)
        compute, comm = float(t["compute_s"][-1]), float(t["comm_s"][-1])
        return {
            "run": run_dir.name, "architecture": f["job"].attrs["replay.architecture"],
            "seed": int(f["job"].attrs["run.seed"]), "status": f.attrs["status"],
            "solved": bool(hit.size), "env_steps": int(steps[hit[0]]) if hit.size else None,
            "seconds": float(time[hit[0]]) if hit.size else None,
            "comm_fraction": comm / (compute + comm) if compute + comm else float("nan"),
            "bytes_per_sample": float(t["bytes_in"][-1]) / max(float(t["samples_trained"][-1]), 1.0),
            "train_steps": int(t["train_steps"][-1]),
        }


def launch(out_dir: Path, ranks: int, seed: int, arch: str, sets: list[str], job: str) -> None:
    cmd = [sys.executable, "-m", "mpirl", "launch", "-n", str(ranks), job, "--set", f"run.seed={seed}",
           "--set", f"replay.architecture={arch}", "--set", f'run.out_dir="{out_dir}"',
           "--set", f'run.name="{arch}-s{seed}"']
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default="jobs/cartpole.toml")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--architectures", nargs="+", default=["proposed", "baseline"])
    p.add_argument("--set", action="append", default=[], help="extra job overrides")
    p.add_argument("--target", type=float, default=195.0)
    p.add_argument("--out", default="runs/solve_table", help="where new runs go")
    p.add_argument("--runs", help="read existing runs under this directory instead of running")
    args = p.parse_args()

    if args.runs:
        out = Path(args.runs)
    else:
        out = Path(args.out).resolve()
        for arch in args.architectures:
            for seed in args.seeds:
                print(f"running {arch} seed {seed} on {args.ranks} ranks ...", flush=True)
                launch(out, args.ranks, seed, arch, args.set, args.job)
    rows = [solve_point(d.parent, args.target) for d in sorted(out.glob("*/run.h5"))]
    if not rows:
        print(f"no runs under {out}", file=sys.stderr)
        return 2

    print(f"\n{'run':34} {'arch':9} {'seed':>4} {'solved':>6} {'env steps':>10} {'wall s':>7} "
          f"{'comm %':>7} {'B/sample':>9} {'train steps':>11}")
    for r in rows:
        print(f"{r['run']:34} {r['architecture']:9} {r['seed']:>4} {str(r['solved']):>6} "
              f"{r['env_steps'] or '-':>10} {r['seconds'] or float('nan'):7.1f} {100 * r['comm_fraction']:7.1f} "
              f"{r['bytes_per_sample']:9.0f} {r['train_steps']:>11}")
    print(f"\nmedian over seeds (target {args.target:g}, mean of the last 20 episodes)")
    print(f"{'arch':9} {'solved':>7} {'env steps':>10} {'wall s':>7} {'learner comm %':>15} {'B/sample':>9}")
    for arch in sorted({r["architecture"] for r in rows}):
        rs = [r for r in rows if r["architecture"] == arch]
        solved = [r for r in rs if r["solved"]]
        med = (lambda k: statistics.median(r[k] for r in solved)) if solved else (lambda k: float("nan"))
        print(f"{arch:9} {len(solved):>3}/{len(rs):<3} {med('env_steps'):10.0f} {med('seconds'):7.1f} "
              f"{100 * statistics.median(r['comm_fraction'] for r in rs):15.1f} "
              f"{statistics.median(r['bytes_per_sample'] for r in rs):9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
