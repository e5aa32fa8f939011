"""IMPALA: asynchronous against synchronous exchange (the survey's central distinction), with all actors equal and
with one actor slowed 2x, side by side from the HDF5 runs.

    python analysis/impala_exchange.py --seeds 1 2 3 --out runs/impala_exchange
    python analysis/impala_exchange.py --runs runs/impala_exchange      # only read runs made earlier

Per seed it runs ``jobs/impala_cartpole.toml`` on 4 ranks (1 learner, 1 queue, 2 actors of 8 games) four ways:
``async`` and ``sync`` (rounds of one trajectory per game, ``replay.batch_size`` 16, ``comm.n_update`` 1), each with
equal actors and with the last actor slowed. The slowdown is measured, not guessed: the delay added to each of the
slowed actor's steps is the time one step of its games took in the seed's equal async run (the actors table's env
steps/s), so it steps about half as fast. Each run stops at a mean return of 475 over the last 20 episodes or after
``--budget`` seconds.

Per configuration it prints the medians over seeds (with their range) of: seconds and env steps to 475, env
steps/s (all actors), learner trajectory steps/s (trained), each actor's share of its time spent waiting (for room
in its queue, or for the round's parameters), the policy lag (mean, and the largest of any batch) and the slowed
actor's step rate against its twin's; then every run. It writes ``table.txt``.
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
JOB = "jobs/impala_cartpole.toml"
E = 8  # the job's games per actor
CONFIGS = ("async-equal", "sync-equal", "async-slowed", "sync-slowed")
METRICS = [("seconds_to_475", "seconds to 475"), ("env_steps_to_475", "env steps to 475"),
           ("env_steps_s", "env steps/s, all actors"), ("learner_steps_s", "learner trajectory steps/s"),
           ("wait_fast", "wait share, the unslowed actor"), ("wait_slow", "wait share, the last actor"),
           ("lag_mean", "policy lag, mean (versions)"), ("lag_max", "policy lag, largest"),
           ("slow_ratio", "last actor's steps/s / the other's")]


def run(out: Path, config: str, seed: int, delay_us: float, budget: float) -> Path:
    exchange, kind = config.split("-")
    cmd = [sys.executable, "-m", "mpirl", "launch", "-n", "4", JOB, "--set", f"run.seed={seed}",
           "--set", f'run.out_dir="{out / config}"', "--set", f'run.name="s{seed}"', "--set", f"run.wall_seconds={budget}",
           "--set", f'impala.exchange="{exchange}"']
    if exchange == "sync":
        cmd += ["--set", "replay.batch_size=16", "--set", "comm.n_update=1"]
    if kind == "slowed":
        cmd += ["--set", f"impala.actor_delay_us=[0, {delay_us:.0f}]"]
    print(f"[{config}] seed {seed}" + (f", last actor +{delay_us:.0f} us a step" if kind == "slowed" else ""),
          flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return max((out / config).glob(f"s{seed}-*/run.h5")).parent


def actor_rates(run_dir: Path) -> dict[int, float]:
    """Each actor's env steps/s over its rows after the first (the first spans the start-up)."""
    with h5py.File(run_dir / "run.h5", "r") as f:
        t = f["buffer_1/actors"]
        actor, steps, time = t["actor"][()], t["env_steps"][()], t["time"][()]
    out = {}
    for a in np.unique(actor):
        m = actor == a
        out[int(a)] = float((steps[m][-1] - steps[m][0]) / max(time[m][-1] - time[m][0], 1e-9))
    return out


def measure(run_dir: Path) -> dict:
    with h5py.File(run_dir / "run.h5", "r") as f:
        reached = "reached 475" in f.attrs["stop_reason"]
        t = {k: f["learner/train"][k][()] for k in ("time", "env_steps", "samples_trained", "lag_mean", "lag_max")}
        a = f["buffer_1/actors"]
        actor, held, time = a["actor"][()], a["throttled_s"][()], a["time"][()]
        unroll = int(f["job"].attrs["impala.unroll"])
        wall = float(f.attrs["wall_seconds"])
    actors = sorted(np.unique(actor))
    wait = {int(x): float(held[actor == x][-1] / max(time[actor == x][-1], 1e-9)) for x in actors}
    rates = actor_rates(run_dir)
    span = max(float(t["time"][-1] - t["time"][0]), 1e-9)
    return {"seconds_to_475": wall if reached else np.nan,
            "env_steps_to_475": float(t["env_steps"][-1]) if reached else np.nan,
            "env_steps_s": float((t["env_steps"][-1] - t["env_steps"][0]) / span),
            "learner_steps_s": float((t["samples_trained"][-1] - t["samples_trained"][0]) * unroll / span),
            "wait_fast": wait[int(actors[0])], "wait_slow": wait[int(actors[-1])],
            "lag_mean": float(np.nanmean(t["lag_mean"])), "lag_max": float(np.nanmax(t["lag_max"])),
            "slow_ratio": rates[int(actors[-1])] / rates[int(actors[0])]}


def table(rows: dict[str, list[dict]]) -> str:
    lines = [f"  {'quantity':34} " + " ".join(f"{c:>16}" for c in CONFIGS)]
    for key, label in METRICS:
        cells = []
        for c in CONFIGS:
            vals = [r[key] for r in rows.get(c, []) if np.isfinite(r[key])]
            med = statistics.median(vals) if vals else np.nan
            cells.append(f"{med:9.4g}" + (f" [{min(vals):.3g},{max(vals):.3g}]" if len(vals) > 1 else ""))
        lines.append(f"  {label:34} " + " ".join(f"{c:>16}" for c in cells))
    lines.append("  (medians over seeds [range]; a run that did not reach 475 counts nowhere in the first two rows: "
                 + ", ".join(f"{c} {sum(np.isnan(r['seconds_to_475']) for r in rows.get(c, []))} of "
                             f"{len(rows.get(c, []))}" for c in CONFIGS) + ")")
    lines.append("\n  every run:")
    for c in CONFIGS:
        for i, r in enumerate(rows.get(c, [])):
            lines.append(f"    {c:13} #{i + 1} " + " ".join(f"{k}={r[k]:.4g}" for k, _ in METRICS))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--budget", type=float, default=300.0, help="seconds a run may take at most")
    p.add_argument("--out", default="runs/impala_exchange")
    p.add_argument("--runs", help="read the runs under this directory instead of running")
    args = p.parse_args()
    out = Path(args.runs or args.out).resolve()
    if not args.runs:
        for seed in args.seeds:
            equal = run(out, "async-equal", seed, 0, args.budget)
            delay = 1e6 * E / float(np.mean(list(actor_rates(equal).values())))  # one step of an actor's games
            run(out, "sync-equal", seed, 0, args.budget)
            run(out, "async-slowed", seed, delay, args.budget)
            run(out, "sync-slowed", seed, delay, args.budget)
    rows = {c: [measure(d.parent) for d in sorted((out / c).glob("*/run.h5"))] for c in CONFIGS}
    if not any(rows.values()):
        print(f"no runs under {out}", file=sys.stderr)
        return 2
    text = table(rows)
    print(text)
    (out / "table.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
