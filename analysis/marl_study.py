"""QMIX, MAC-PO and AccMER side by side at 8, 16 and 32 agents: AccMER's end-to-end question.

    python analysis/marl_study.py --steps 300 --seeds 1 2 3 --out runs/marl_study
    python analysis/marl_study.py --out runs/marl_study --agents 8 --seeds 1     # a smaller grid
    python analysis/marl_study.py --out runs/marl_study --read                    # only read earlier runs

Every (agents, variant, seed) runs ``jobs/predator_prey_qmix.toml`` for a fixed number of train
steps (``--steps``) with the replay on the learner (``replay.architecture = "baseline"``, as in AccMER,
where the learner samples its own memory; ``--set`` adds overrides to every run). A completed run already in
``--out`` with the same settings (its recorded job) is not run again. Per (agents, variant) it prints the medians over
seeds of: the learner's wall time from its first to its last train step, the share of that spent
sampling (gathering batches) and training, the final greedy test return (mean of ``qmix.test_episodes``
episodes) and its captures, and the ratio of each variant's time to MAC-PO's (AccMER's reported
speed-ups are over MAC-PO: -17 %, -19.8 %, -25.4 % at 8, 16, 32 agents). It writes ``table.txt``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import h5py

from mpirl.config import MOVED

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "jobs" / "predator_prey_qmix.toml"
VARIANTS = {"qmix": ["qmix.loss_weights=none", "qmix.sampler=uniform"],
            "macpo": ["qmix.loss_weights=macpo", "qmix.sampler=uniform"],
            "accmer": ["qmix.loss_weights=macpo", "qmix.sampler=accmer"]}
SOURCE = {8: -17.0, 16: -19.8, 32: -25.4}  # AccMER's time change vs MAC-PO, %


def run_name(agents: int, variant: str, seed: int) -> str:
    return f"pp{agents}-{variant}-s{seed}"


def overrides(agents: int, variant: str, seed: int, steps: int, extra: list[str]) -> list[str]:
    """The settings of one run (besides its name and directory): what makes an earlier run the same run."""
    return [f"run.seed={seed}", f"run.train_steps={steps}", "run.wall_seconds=0",
            f"env.predator_prey.predators={agents}", "replay.architecture=baseline", *VARIANTS[variant], *extra]


def same(recorded, wanted: str) -> bool:
    """A recorded job setting equals a ``--set`` value (numbers as numbers, lists such as ``[250, 0]`` element by
    element, strings without quotes or case)."""
    if wanted.strip().startswith("["):
        import numpy as np
        import tomllib
        try:
            return np.array_equal(np.asarray(recorded), np.asarray(tomllib.loads(f"v = {wanted}")["v"]))
        except (tomllib.TOMLDecodeError, ValueError):
            return False
    try:
        return float(recorded) == float(wanted)
    except (TypeError, ValueError):
        return str(recorded).lower() == wanted.strip().strip("'\"").lower()


def finished(out: Path, name: str, sets: list[str]) -> Path | None:
    """A completed run of this name whose recorded job has every one of ``sets`` (so --steps 300 never
    reuses a 60-step run)."""
    for run_h5 in sorted(out.glob(f"{name}-*/run.h5")):
        with h5py.File(run_h5, "r", locking=False) as f:
            if f.attrs.get("status") != "completed":
                continue
            job = {MOVED.get(k, k): v for k, v in f["job"].attrs.items()}  # runs older than a move: its old key
            if all(key in job and same(job[key], value) for key, value in (s.split("=", 1) for s in sets)):
                return run_h5.parent
    return None


def run_one(out: Path, name: str, sets: list[str], ranks: int) -> Path:
    done = finished(out, name, sets)
    if done:
        print(f"{name}: done earlier ({done.name})", flush=True)
        return done
    every = [f"run.name={name}", f"run.out_dir={out}", *sets]
    cmd = [sys.executable, "-m", "mpirl", "launch", "-n", str(ranks), str(JOB), *[x for s in every for x in ("--set", s)]]
    print(f"{name}: running", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return finished(out, name, sets)


def measure(run_dir: Path) -> dict:
    with h5py.File(run_dir / "learner.h5", "r") as f:
        t, test = f["train"], f["test"]
        # The learner's time from its first to its last train step, and where it went (cumulative columns).
        first = 0
        span = float(t["time"][-1] - t["time"][first])
        sample = float(t["sample_s"][-1] - t["sample_s"][first])
        train = float(t["train_s"][-1] - t["train_s"][first])
        steps = int(t["train_steps"][-1] - t["train_steps"][first])
        return {"s_per_step": span / max(steps, 1), "sample_pct": 100 * sample / max(sample + train, 1e-9),
                "sample_ms": 1e3 * sample / max(steps, 1), "train_ms": 1e3 * train / max(steps, 1),
                "return": float(test["return_mean"][-1]), "captures": float(test["captures"][-1]),
                "lone": float(test["lone_catches"][-1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "marl_study")
    p.add_argument("--agents", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=300, help="train steps per run")
    p.add_argument("-n", type=int, default=5, help="ranks per run (1 learner, 1 buffer, n - 2 actors)")
    p.add_argument("--set", action="append", default=[], help="an override for every run")
    p.add_argument("--read", action="store_true", help="only read runs made earlier")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = {}
    for agents in args.agents:
        for variant in args.variants:
            got = []
            for seed in args.seeds:
                name = run_name(agents, variant, seed)
                sets = overrides(agents, variant, seed, args.steps, args.set)
                run_dir = finished(args.out, name, sets) if args.read else run_one(args.out, name, sets, args.n)
                if run_dir:
                    got.append(measure(run_dir))
            if got:
                rows[agents, variant] = {k: statistics.median(g[k] for g in got) for k in got[0]} | {
                    "seeds": len(got), "return_min": min(g["return"] for g in got),
                    "return_max": max(g["return"] for g in got)}
    head = (f"{'agents':>6} {'variant':>7} {'seeds':>5} {'s/step':>8} {'vs macpo':>9} {'source':>7} "
            f"{'sample ms':>10} {'train ms':>9} {'sample %':>9} {'test return (min..max)':>24} {'captures':>9}")
    lines = [head]
    for (agents, variant), r in rows.items():
        ref = rows.get((agents, "macpo"))
        vs = f"{100 * (r['s_per_step'] / ref['s_per_step'] - 1):+.1f} %" if ref and variant != "macpo" else "-"
        src = f"{SOURCE[agents]:+.1f}" if variant == "accmer" and agents in SOURCE else "-"
        ret = f"{r['return']:.1f} ({r['return_min']:.1f}..{r['return_max']:.1f})"
        lines.append(f"{agents:>6} {variant:>7} {r['seeds']:>5} {r['s_per_step']:>8.3f} {vs:>9} {src:>7} "
                     f"{r['sample_ms']:>10.2f} {r['train_ms']:>9.1f} {r['sample_pct']:>8.2f}% {ret:>24} "
                     f"{r['captures']:>9.2f}")
    text = "\n".join(lines)
    print(text)
    (args.out / "table.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
