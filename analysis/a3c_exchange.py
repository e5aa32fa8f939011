"""The gradient family: asynchronous against synchronous exchange of gradients (the survey's central distinction),
with all workers equal and with the last worker slowed 2x, side by side from the HDF5 runs.

    python analysis/a3c_exchange.py --seeds 1 2 3 --out runs/a3c_exchange
    python analysis/a3c_exchange.py --seeds 1 --configs async-equal sync-D1-slowed --budget 60
    python analysis/a3c_exchange.py --runs runs/a3c_exchange      # only read runs made earlier

Per seed it runs ``jobs/a3c_cartpole.toml`` (A2C gradients, 4 workers of 8 CartPole games) five ways, each with
equal workers (``-equal``) and with the last worker slowed (``-slowed``), ten configurations in all:

* ``async``: a parameter server on rank 0 applies each gradient as it arrives (A3C; 5 ranks);
* ``sync-D0``, ``sync-D1``: DPPO's leader; each round waits for the gradients of 4 - D workers (``a3c.stragglers``
  D), a late one is dropped (5 ranks);
* ``allreduce``: DD-PPO, no server, every rank a worker, ``a3c.sync_frac`` 1 (no preemption; 4 ranks);
* ``allreduce-preempt``: the same with ``a3c.sync_frac`` 0.6: a straggler ends its rollout early once 3 of the 4
  have finished theirs (4 ranks).

The slowdown is measured, not guessed. From the seed's ``async-equal`` run (run first when missing), the last
worker's busy time per vector step (one step of its 8 games),

    delay_us = 1e6 * compute_s / sum(steps)

(``compute_s`` from its last ``rollouts`` row: the wall-clock seconds it spent playing and computing gradients, all
but its waiting for the exchange, so on a crowded machine also the time it was descheduled; ``steps`` the vector
steps of each of its rollouts), is added to each env step of the slowed worker (``a3c.worker_delay_us = [0, 0, 0,
delay_us]``), so its busy time per step doubles: it steps about half as fast (exactly half only where it never waits
for the exchange; the table's last row says what it got). Each run stops at a mean return of 475 over the last 20
episodes (the job's ``run.target_return``) or after ``--budget`` seconds (``run.wall_seconds``, counted from the
start of the server or the workers' exchange, so a run's wall time exceeds it by its start-up); runs land in
``<out>/<config>/s<seed>-<date>-<time>``.

Per configuration it prints the medians over seeds (with their range) of:

* seconds to 475: the run's ``wall_seconds`` (start-up and the final test round included) if it reached 475;
* env steps to 475: every step the workers played (the sum of their last ``rollouts`` rows; under a server that
  includes the rollout each worker was in when the stop came, at most 16 x 8 steps a worker);
* updates/s: the parameters' versions over the ``updates`` table's time span (an update is one gradient under
  ``async``, a round's average under ``sync`` and ``allreduce``);
* env steps/s: the workers' rates summed, each over its rollouts after the first (the first spans the start-up);
* wait share: a worker's ``wait_s / (compute_s + wait_s)`` (its last ``rollouts`` row): the fast workers' mean,
  and the last worker's;
* dropped: the share of the gradients sent that were not applied;
* staleness (``async`` only): the mean and largest staleness, in versions, of the applied gradients;
* preempted (``allreduce`` only): the share of the workers' rollouts ended early;
* the last worker's env steps/s over the mean of the others';
* the final policy's test round: the mean return of the games the run played with its last parameters
  (``updates/test``), and how many runs' rounds fell under 60 (random play: about 22). The stop reads a window of
  training episodes that lags the parameters, so a policy that collapsed inside it can still stop a run
  (docs/a3c.md).

Then every run in one line. It writes ``table.txt`` beside the runs. With several runs of one seed and
configuration under ``<out>``, the newest counts.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
JOB = "jobs/a3c_cartpole.toml"
TARGET = 475.0
NAN = float("nan")
# exchange: (ranks, its settings)
EXCHANGES = {
    "async": (5, ['a3c.exchange="async"']),
    "sync-D0": (5, ['a3c.exchange="sync"', "a3c.stragglers=0"]),
    "sync-D1": (5, ['a3c.exchange="sync"', "a3c.stragglers=1"]),
    "allreduce": (4, ['a3c.exchange="allreduce"', "a3c.sync_frac=1.0"]),
    "allreduce-preempt": (4, ['a3c.exchange="allreduce"', "a3c.sync_frac=0.6"]),
}
KINDS = {"equal": "all workers equal", "slowed": "the last worker slowed 2x"}
CONFIGS = tuple(f"{x}-{k}" for k in KINDS for x in EXCHANGES)
BASE = "async-equal"  # the slowed runs' delay is measured on it
METRICS = [("seconds_to_475", "seconds to 475"), ("env_steps_to_475", "env steps to 475"),
           ("updates_s", "updates/s"), ("env_steps_s", "env steps/s, all workers"),
           ("wait_fast", "wait share, fast workers (mean)"), ("wait_slow", "wait share, the last worker"),
           ("dropped", "gradients dropped / sent"), ("stale_mean", "staleness, mean (async)"),
           ("stale_max", "staleness, largest (async)"), ("preempted", "rollouts preempted (allreduce)"),
           ("slow_ratio", "last worker's steps/s / others'"), ("test_return", "final policy's test round")]
LOW_TEST = 60.0  # a final test round under this plays about as random play does (CartPole: about 22)
RUN_NAME = re.compile(r"^s(\d+)-(\d{8}-\d{6})(?:-(\d+))?$")


# ---------------------------------------------------------------- reading a run (pure: h5py only)
def _columns(group: h5py.Group) -> dict[str, np.ndarray]:
    return {k: group[k][()] for k in group}


def workers(run_dir: Path) -> list[dict]:
    """Each worker's ``rollouts`` columns (``worker_<rank>`` in run.h5), ordered by its index among the workers
    (the file's ``worker`` attribute: the index ``a3c.worker_delay_us`` is read with), with ``rank`` and ``worker``."""
    out = []
    with h5py.File(run_dir / "run.h5", "r") as f:
        for name in (k for k in f if re.fullmatch(r"worker_\d+", k)):
            g = f[name]
            rank = int(name.split("_")[1])
            out.append({"rank": rank, "worker": int(g.attrs.get("worker", rank)), **_columns(g["rollouts"])})
    return sorted(out, key=lambda w: w["worker"])


def step_delay_us(run_dir: Path) -> float:
    """The last worker's time busy per vector step, in microseconds: 1e6 * compute_s (its last rollouts row) /
    the vector steps of all its rollouts; the delay that doubles its busy time per step."""
    last = workers(run_dir)[-1]
    steps = int(np.sum(last["steps"]))
    if not len(last["compute_s"]) or steps <= 0:
        raise ValueError(f"{run_dir}: worker rank {last['rank']} has no rollouts to measure a step by")
    return 1e6 * float(last["compute_s"][-1]) / steps


def worker_rate(w: dict) -> float:
    """A worker's env steps/s over its rollouts after the first (the first spans the start-up); NaN with one row."""
    t, s = w["time"], w["env_steps"]
    if len(t) < 2 or t[-1] <= t[0]:
        return NAN
    return float((s[-1] - s[0]) / (t[-1] - t[0]))


def wait_share(w: dict) -> float:
    if not len(w["time"]):
        return NAN
    c, q = float(w["compute_s"][-1]), float(w["wait_s"][-1])
    return q / (c + q) if c + q > 0 else NAN


def measure(run_dir: Path) -> dict:
    """One run's quantities (see the module's docstring), and what it was: seed, exchange, delays, stop."""
    with h5py.File(run_dir / "run.h5", "r") as f:
        attrs = dict(f.attrs)
        job = dict(f["job"].attrs)
        u = _columns(f["updates/updates"])
        test = f["updates/test/return_mean"][()] if "test" in f["updates"] else np.zeros(0)
    ws = workers(run_dir)
    exchange = str(job["a3c.exchange"])
    reason = str(attrs.get("stop_reason", ""))
    reached = f"reached {TARGET:g}" in reason
    rates = [worker_rate(w) for w in ws]
    waits = [wait_share(w) for w in ws]
    sent = sum(int(w["gradients"][-1]) for w in ws if len(w["time"]))
    dropped = sum(int(w["dropped"][-1]) for w in ws if len(w["time"]))
    n_rollouts = sum(len(w["time"]) for w in ws)
    v, t = u["version"], u["time"]
    applied = np.asarray(u["staleness"], float)[np.asarray(u["applied"], bool)]
    others = [r for r in rates[:-1] if np.isfinite(r)]
    return {
        "run": run_dir.name, "seed": int(job.get("run.seed", -1)), "exchange": exchange,
        "status": str(attrs.get("status", "unknown")), "stop_reason": reason,
        "delay_us": [float(x) for x in np.atleast_1d(job.get("a3c.worker_delay_us", [0]))],
        "seconds_to_475": float(attrs["wall_seconds"]) if reached else NAN,
        "env_steps_to_475": float(sum(int(w["env_steps"][-1]) for w in ws if len(w["time"]))) if reached else NAN,
        "updates_s": float((v[-1] - v[0]) / (t[-1] - t[0])) if len(t) > 1 and t[-1] > t[0] else NAN,
        "env_steps_s": float(np.sum(rates)) if all(np.isfinite(rates)) else NAN,
        "wait_fast": float(np.mean(waits[:-1])) if len(waits) > 1 else NAN, "wait_slow": waits[-1],
        "dropped": dropped / sent if sent else NAN,
        "stale_mean": float(applied.mean()) if exchange == "async" and applied.size else NAN,
        "stale_max": float(applied.max()) if exchange == "async" and applied.size else NAN,
        "preempted": (float(sum(np.sum(w["preempted"]) for w in ws)) / n_rollouts
                      if exchange == "allreduce" and n_rollouts else NAN),
        "slow_ratio": rates[-1] / float(np.mean(others)) if others and np.isfinite(rates[-1]) else NAN,
        "test_return": float(test[-1]) if len(test) else NAN,
    }


def newest_runs(config_dir: Path, seeds: list[int] | None = None) -> dict[int, Path]:
    """Seed -> the newest finished run directory (``s<seed>-<date>-<time>[-k]``) under ``config_dir``."""
    found: dict[int, tuple] = {}
    for h5 in config_dir.glob("s*/run.h5"):
        m = RUN_NAME.match(h5.parent.name)
        if not m or (seeds is not None and int(m[1]) not in seeds):
            continue
        with h5py.File(h5, "r") as f:
            if f.attrs.get("status") not in ("completed",):
                print(f"skipping {h5.parent}: status {f.attrs.get('status', 'unknown')}", file=sys.stderr)
                continue
        key = (m[2], int(m[3] or 0))
        if int(m[1]) not in found or key > found[int(m[1])][0]:
            found[int(m[1])] = (key, h5.parent)
    return {s: d for s, (_, d) in sorted(found.items())}


# ---------------------------------------------------------------- running
def run(out: Path, config: str, seed: int, delay_us: float, budget: float) -> Path | None:
    exchange, kind = config.rsplit("-", 1)
    ranks, sets = EXCHANGES[exchange]
    sets = [*sets, f"run.seed={seed}", f'run.out_dir="{out / config}"', f'run.name="s{seed}"',
            f"run.wall_seconds={budget}"]
    if kind == "slowed":
        sets.append(f"a3c.worker_delay_us=[0, 0, 0, {delay_us:.0f}]")
    cmd = [sys.executable, "-m", "mpirl", "launch", "-n", str(ranks), JOB]
    for s in sets:
        cmd += ["--set", s]
    print(f"[{config}] seed {seed}" + (f", last worker +{delay_us:.0f} us a step" if kind == "slowed" else ""),
          flush=True)
    before = set((out / config).glob(f"s{seed}-*"))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        print(f"[{config}] seed {seed} failed (exit {proc.returncode}):\n{tail}", file=sys.stderr, flush=True)
        return None
    new = sorted(set((out / config).glob(f"s{seed}-*")) - before)
    return new[-1] if new else None


# ---------------------------------------------------------------- the table
def fmt(x: float) -> str:
    if not np.isfinite(x):
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:.4g}"


def fmt_range(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:.3g}"


def cell(rows: list[dict], key: str) -> str:
    vals = [r[key] for r in rows if np.isfinite(r[key])]
    if not vals:
        return "not reached" if key == "seconds_to_475" and rows else "-"
    out = fmt(statistics.median(vals))
    return out + (f" [{fmt_range(min(vals))},{fmt_range(max(vals))}]" if len(vals) > 1 else "")


def table(rows: dict[str, list[dict]], configs: list[str]) -> str:
    lines = []
    for kind, title in KINDS.items():
        cols = [c for c in configs if c.endswith(f"-{kind}")]
        if not cols:
            continue
        cells = {c: [cell(rows.get(c, []), k) for k, _ in METRICS] for c in cols}
        width = {c: max(len(c) - len(kind) - 1, *(len(x) for x in cells[c])) for c in cols}
        lines.append(f"{title}:")
        lines.append(f"  {'quantity':34} " + "  ".join(f"{c[:-len(kind) - 1]:>{width[c]}}" for c in cols))
        for i, (_, label) in enumerate(METRICS):
            lines.append(f"  {label:34} " + "  ".join(f"{cells[c][i]:>{width[c]}}" for c in cols))
        missed = {c: sum(np.isnan(r["seconds_to_475"]) for r in rows.get(c, [])) for c in cols}
        low = {c: sum(r["test_return"] < LOW_TEST for r in rows.get(c, [])) for c in cols}
        lines.append("  runs: " + ", ".join(f"{c[:-len(kind) - 1]} {len(rows.get(c, []))} ({missed[c]} did not reach "
                                            f"475, {low[c]} tested under {LOW_TEST:g})" for c in cols))
        lines.append("")
    lines.append("  (medians over seeds [range]; a run that did not reach 475 counts nowhere in the first two rows; "
                 "'-': not measured there)")
    lines.append("\n  every run:")
    for c in configs:
        for r in rows.get(c, []):
            delay = max(r["delay_us"])
            vals = " ".join(f"{k}={'not reached' if k == 'seconds_to_475' and np.isnan(r[k]) else fmt(r[k])}"
                            for k, _ in METRICS)
            lines.append(f"    {c:24} s{r['seed']:<3} " + (f"delay_us={delay:.0f} " if delay else "") + vals)
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", help="seeds to run (default 1); with --runs: only these")
    p.add_argument("--budget", type=float, default=300.0, help="seconds a run may take at most")
    p.add_argument("--out", default="runs/a3c_exchange")
    p.add_argument("--runs", help="read the runs under this directory instead of running")
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS), metavar="CONFIG",
                   help="a subset of: " + " ".join(CONFIGS))
    args = p.parse_args()
    configs = [c for c in CONFIGS if c in args.configs]  # the table's order
    out = Path(args.runs or args.out).resolve()
    seeds = args.seeds if args.runs else (args.seeds or [1])
    failed = 0
    if not args.runs:
        for seed in seeds:
            delay = None
            if BASE in configs:
                failed += run(out, BASE, seed, 0, args.budget) is None
            if any(c.endswith("-slowed") for c in configs):
                base = newest_runs(out / BASE, [seed]).get(seed)
                if base is None:
                    print(f"[{BASE}] seed {seed}: needed to measure the slowdown", flush=True)
                    base = run(out, BASE, seed, 0, args.budget)
                if base is None:
                    print(f"seed {seed}: no {BASE} run to measure the slowdown on; its slowed runs are skipped",
                          file=sys.stderr)
                else:
                    delay = step_delay_us(base)
                    print(f"seed {seed}: the last worker's step in {base.name}: {delay:.0f} us", flush=True)
            for c in configs:
                if c == BASE or (c.endswith("-slowed") and delay is None):
                    continue
                failed += run(out, c, seed, delay or 0, args.budget) is None
    rows = {c: [measure(d) for d in newest_runs(out / c, seeds).values()] for c in configs}
    if args.runs:
        configs = [c for c in configs if rows[c]]  # only what is there
    if not any(rows.values()):
        print(f"no runs under {out}", file=sys.stderr)
        return 2
    text = table(rows, configs)
    print(text)
    (out / "table.txt").write_text(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
