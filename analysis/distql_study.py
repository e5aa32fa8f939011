"""DistQL's study: 1/2/4/8 workers x ALL/Partial x tau = 10/50/100 x seeds, on Taxi or CartPole; episodes to
threshold beside the authors' result files; and synchronous against asynchronous exchange with one worker
slowed 2x.

    python analysis/distql_study.py --env taxi --out runs/distql_study             # the whole Taxi grid
    python analysis/distql_study.py --env cartpole --taus 10 --out runs/distql_study
    python analysis/distql_study.py --env taxi --sync-async --out runs/distql_study
    python analysis/distql_study.py --env taxi --out runs/distql_study --read      # only read earlier runs

Every run is ``mpirl launch -n N+1 jobs/<env>_distql.toml`` with its settings; a completed run already in
``--out`` with the same recorded settings is not run again (``--jobs`` runs that many launches at once). With
one worker ALL and Partial are the same algorithm (the server holds only the worker's own pairs), so Partial's
n = 1 reuses ALL's runs.

A curve is the per-episode mean return over a run's workers, then over seeds; it is cut into 41 bins
(``np.array_split``, as the source's processResults.py did) and episodes-to-threshold is the first bin whose mean
is >= the threshold, x 50 ("never" when none is). Returns are the ones the workers learned from: on CartPole
they include the source's -200 end penalty, so a return of 0 is a 200-step episode. Writes ``<env>_table.md``
and ``<env>_<mode>_tau<t>.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from marl_study import finished  # noqa: E402 - a completed run with the same recorded settings

JOBS = {"taxi": ROOT / "jobs" / "taxi_distql.toml", "cartpole": ROOT / "jobs" / "cartpole_distql.toml"}
THRESHOLDS = {"taxi": (0.0, -50.0), "cartpole": (0.0,)}
BINS = 41
# Episodes to threshold for 1/2/4/8 workers, from the authors' result files (None: never).
REFERENCE = {
    ("taxi", "all", 10): {0.0: (1400, 550, 300, 250), -50.0: (650, 300, 200, 100)},
    ("taxi", "all", 50): {0.0: (1350, 600, 400, 300), -50.0: (600, 350, 250, 200)},
    ("taxi", "all", 100): {0.0: (1150, 700, 550, 400), -50.0: (700, 400, 300, 250)},
    ("taxi", "partial", 10): {0.0: (None, 1100, 700, 650), -50.0: (700, 500, 400, 350)},
    ("cartpole", "all", 10): {0.0: (600, 600, 300, 200)},
    ("cartpole", "partial", 10): {0.0: (800, 850, 1000, 1350)},
}


def run_name(env: str, mode: str, tau: int, n: int, seed: int, tag: str = "") -> str:
    return f"{env}-{mode}-tau{tau}-n{n}{tag}-s{seed}"


def launch(out: Path, env: str, name: str, sets: list[str], ranks: int) -> Path:
    done = finished(out, name, sets)
    if done:
        return done
    every = [f"run.name={name}", f"run.out_dir={out}", *sets]
    cmd = [sys.executable, "-m", "mpirl", "launch", "-n", str(ranks), str(JOBS[env]),
           *[x for s in every for x in ("--set", s)]]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    print(f"{name}: done", flush=True)
    return finished(out, name, sets)


def settings(mode: str, tau: int, n: int, seed: int, episodes: int, extra: list[str]) -> list[str]:
    return [f"run.seed={seed}", f"distql.workers={n}", f"distql.mode={mode}", f"distql.tau={tau}",
            f"distql.episodes={episodes}", *extra]


def curve(run_dir: Path, episodes: int) -> np.ndarray:
    """The per-episode mean return over the run's workers."""
    with h5py.File(run_dir / "qserver.h5", "r", locking=False) as f:
        e = f["episodes"]
        ep, ret = e["episode"][()], e["return"][()]
    total, count = np.zeros(episodes), np.zeros(episodes)
    np.add.at(total, ep, ret)
    np.add.at(count, ep, 1)
    return total / np.maximum(count, 1)


def binned(c: np.ndarray) -> np.ndarray:
    return np.array([b.mean() for b in np.array_split(c, BINS)])


def to_threshold(b: np.ndarray, thr: float, episodes: int) -> int | None:
    """The first bin >= ``thr``, in episodes (x 50 for 2000 episodes)."""
    hit = np.flatnonzero(b >= thr)
    return int(hit[0]) * (episodes // (BINS - 1)) if len(hit) else None


def fmt(x) -> str:
    return "never" if x is None else str(x)


def grid(args) -> None:
    env, out = args.env, args.out
    cases = [(mode, tau, n, seed) for mode in args.modes for tau in args.taus for n in args.workers
             for seed in args.seeds]
    todo = [(m, t, n, s) for m, t, n, s in cases if not (m == "partial" and n == 1)]

    def one(case):
        mode, tau, n, seed = case
        sets = settings(mode, tau, n, seed, args.episodes, args.set)
        name = run_name(env, mode, tau, n, seed)
        return case, (finished(out, name, sets) if args.read else launch(out, env, name, sets, n + 1))

    with ThreadPoolExecutor(args.jobs) as pool:
        runs = dict(pool.map(one, todo))
    curves: dict[tuple, np.ndarray] = {}
    for mode in args.modes:
        for tau in args.taus:
            for n in args.workers:
                dirs = [runs.get(("all" if n == 1 else mode, tau, n, s)) for s in args.seeds]
                dirs = [d for d in dirs if d]
                if dirs:
                    curves[mode, tau, n] = np.mean([curve(d, args.episodes) for d in dirs], axis=0)
    lines = [f"# DistQL on {env}: episodes to threshold ({len(args.seeds)} seeds; first bin of {BINS} >= "
             f"threshold, x {args.episodes // (BINS - 1)}); reference = the authors' result files", ""]
    ratios = []
    for thr in THRESHOLDS[env]:
        lines += [f"## threshold {thr:g}", "",
                  "| mode, tau | " + " | ".join(f"n={n}" for n in args.workers) + " | reference 1/2/4/8 |",
                  "|---|" + "---|" * (len(args.workers) + 1)]
        for mode in args.modes:
            for tau in args.taus:
                got = [to_threshold(binned(curves[mode, tau, n]), thr, args.episodes) if (mode, tau, n) in curves else None
                       for n in args.workers]
                ref = REFERENCE.get((env, mode, tau), {}).get(thr)
                lines.append(f"| {mode.upper()} {tau} | " + " | ".join(map(fmt, got)) + " | "
                             + (" / ".join(map(fmt, ref)) if ref else "-") + " |")
                if 1 in args.workers and 8 in args.workers:
                    first, last = got[args.workers.index(1)], got[args.workers.index(8)]
                    if first and last is not None:
                        ratios.append(f"{mode.upper()} {tau}, threshold {thr:g}: 8 workers need "
                                      f"{last / first:.2f} of 1 worker's episodes")
        lines.append("")
    lines += ratios + [""]
    lines.append("Final mean return (last bin) per n: " + "; ".join(
        f"{m.upper()} {t}: " + ", ".join(f"{binned(curves[m, t, n])[-1]:.1f}" for n in args.workers
                                         if (m, t, n) in curves) for m in args.modes for t in args.taus))
    text = "\n".join(lines)
    print(text)
    (out / f"{env}_table.md").write_text(text + "\n")
    plot(env, out, curves, args)


def plot(env: str, out: Path, curves: dict, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for mode in args.modes:
        for tau in args.taus:
            fig, ax = plt.subplots(figsize=(6, 4))
            for n in args.workers:
                if (mode, tau, n) in curves:
                    b = binned(curves[mode, tau, n])
                    ax.plot(np.arange(BINS) * (args.episodes // (BINS - 1)), b, label=f"{n} worker{'s' if n > 1 else ''}")
            for thr in THRESHOLDS[env]:
                ax.axhline(thr, color="grey", lw=0.8, ls="--")
            ax.set(xlabel="episode", ylabel="mean return (workers, seeds)", title=f"DistQL {env}, {mode.upper()}, "
                                                                                    f"tau {tau}")
            ax.legend()
            fig.tight_layout()
            fig.savefig(out / f"{env}_{mode}_tau{tau}.png", dpi=100)
            plt.close(fig)


def _worker_view(run: Path, n: int) -> dict:
    """The job's wall time, and per worker its wait share and when its goodbye reached the server."""
    with h5py.File(run / "qserver.h5", "r", locking=False) as f, h5py.File(run / "run.h5", "r", locking=False) as r:
        w = f["workers"]
        last = [np.flatnonzero(w["worker"][()] == k)[-1] for k in range(1, n + 1)]
        return {"wall": float(r.attrs["wall_seconds"]),
                "share": [float(w["wait_s"][i] / (w["wait_s"][i] + w["compute_s"][i])) for i in last],
                "done": [float(w["time"][i]) for i in last],
                "step_us": float(1e6 * np.mean([w["compute_s"][i] / w["env_steps"][i] for i in last]))}


def sync_async(args) -> None:
    """Worker 1 slowed 2x (a delay per env step equal to the workers' own step time in a fair run), synchronous
    against asynchronous exchange, ALL, tau 10, 4 workers: each worker's wait share and when it finished."""
    env, out, n = args.env, args.out, 4
    rows: dict[str, list] = {}
    for seed in args.seeds:
        sets = settings("all", 10, n, seed, args.episodes, args.set)
        name = run_name(env, "all", 10, n, seed, "-fair")
        fair = _worker_view(finished(out, name, sets) if args.read else launch(out, env, name, sets, n + 1), n)
        rows.setdefault("fair (async, no delay)", []).append(fair)
        for exchange in ("async", "sync"):
            slow = sets + [f"distql.exchange={exchange}",
                           f"distql.worker_delay_us=[{int(round(fair['step_us']))}, 0, 0, 0]"]
            name = run_name(env, "all", 10, n, seed, f"-slow-{exchange}")
            run = finished(out, name, slow) if args.read else launch(out, env, name, slow, n + 1)
            rows.setdefault(f"worker 1 slowed, {exchange}", []).append(_worker_view(run, n))
    med = statistics.median
    lines = [f"# DistQL on {env}: worker 1 slowed 2x, 4 workers, ALL, tau 10 ({len(args.seeds)} seeds, medians)", "",
             "| run | job's wall time (s) | worker 1 done at (s) | workers 2-4 done at (s) | wait share, worker 1 "
             "| wait share, workers 2-4 |", "|---|---|---|---|---|---|"]
    for what, got in rows.items():
        lines.append(f"| {what} | {med(g['wall'] for g in got):.1f} | {med(g['done'][0] for g in got):.1f} | "
                     f"{med(x for g in got for x in g['done'][1:]):.1f} | {100 * med(g['share'][0] for g in got):.1f} % "
                     f"| {100 * med(x for g in got for x in g['share'][1:]):.1f} % |")
    lines.append(f"\nthe slow worker's delay: {med(g['step_us'] for g in rows['fair (async, no delay)']):.1f} us a "
                 "step (the fair run's mean step time, its time slices on a shared core included)")
    text = "\n".join(lines)
    print(text)
    (out / f"{env}_sync_async.md").write_text(text + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=list(JOBS), default="taxi")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "distql_study")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--modes", nargs="+", default=["all", "partial"], choices=["all", "partial"])
    p.add_argument("--taus", type=int, nargs="+", default=[10, 50, 100])
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(1, 11)))
    p.add_argument("--episodes", type=int, default=2000, help="episodes per worker")
    p.add_argument("--jobs", type=int, default=2, help="launches at once")
    p.add_argument("--set", action="append", default=[], help="an override for every run")
    p.add_argument("--sync-async", action="store_true", help="the sync vs async comparison instead of the grid")
    p.add_argument("--read", action="store_true", help="only read runs made earlier")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (sync_async if args.sync_async else grid)(args)


if __name__ == "__main__":
    main()
