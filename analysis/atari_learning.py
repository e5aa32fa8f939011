"""Learning on Atari, side by side: ours (IMPALA, PPO), Sample Factory's APPO and SB3's PPO on one game, on the same
cores, each for the same frame budget and the same wall, return against env frames and against hours.

    python analysis/atari_learning.py [--game pong] [--frames 4000000] [--wall 2400] [--seeds 1] [--first-seed 1]
                                      [--which impala,ppo,sf,sb3] [--runs runs/atari-learning] [--set KEY=VALUE ...]
                                      [--out docs/figures/atari-pong-learning.png]
    python analysis/atari_learning.py --redraw FILE.h5 [FILE.h5 ...] [--rename OLD=NEW ...] [--drop SIDE ...]
                                      [--out FILE.png]

Runs back to back on this machine, seed by seed, each until ``--frames`` env frames (agent steps x frame skip 4)
or ``--wall`` seconds of its own clock from its first env step, whichever comes first:

* ours IMPALA: ``jobs/impala_<game>.toml`` (4 ranks: learner, trajectory queue, 2 actors of 8 games), as
  ``mpirl bench atari`` runs it (:func:`mpirl.bench.atari.launch_ours`), its run directory kept under ``--runs``;
* ours PPO: ``jobs/ppo_<game>.toml`` (2 workers of 8 games, DD-PPO's allreduce), the same way;
* Sample Factory 2.1.1's APPO with its Atari example's settings (``mpirl/bench/refs/sf_run.py``: 2 rollout
  workers of 8 games, one policy worker), its episodes kept;
* Stable-Baselines3's PPO with RL Baselines3 Zoo's Atari settings (``mpirl/bench/refs/sb3_atari.py``: 8 games in one
  process), which are PPO's paper and ours' PPO job file: the reference PPO at ours' settings.

Each side's schedules span the frame budget (ours: ``agent.schedule_steps = 0``, the run's; Sample Factory's
learning rate decays linearly over its budget, SB3's learning rate and clip too). Every side's episodes are whole
games with their unclipped return; the x axes are the frames of the episodes finished by then (each side's
finished episodes' lengths summed, x 4) and the hours since that side's first env step. Curves: the mean of the last
20 episodes. The table: that mean at equal frames and at equal hours (a quarter, half and all of the span every side
reached). The episodes go into ``FILE.h5`` beside the PNG (``--redraw`` draws
from it again; given several files, from their sides and seeds together, which are then saved beside ``--out``: one
seed of a side in two files, files of other games or budgets are refused). ``--first-seed K`` runs seeds K.. so that
a later call adds seeds to an earlier one's. ``--set KEY=VALUE`` (repeated) changes a setting of ours' jobs (a
variant: the side is then named with its settings, ``mpirl PPO allreduce [env.envs_per_actor=4]``, and drawn dashed
in its side's colour); ``--rename OLD=NEW`` names a side of the files ``--redraw`` reads anew (a variant run
before its setting had a name of its own); ``--drop SIDE`` leaves a side of them out.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mpirl.bench import atari  # noqa: E402
from mpirl.metrics.summary import in_time_order, window_means  # noqa: E402

WINDOW = 20  # episodes in a curve's mean
SB3 = "SB3 PPO (zoo)"
SIDES = {"impala": atari.IMPALA, "ppo": atari.PPO, "sf": "Sample Factory APPO", "sb3": SB3}
OURS = ("impala", "ppo")
COLOURS = {atari.IMPALA: "tab:blue", atari.PPO: "tab:green", "Sample Factory APPO": "tab:red", SB3: "tab:purple"}


VARIANT_LINES = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))


def styles(names: list[str]) -> dict[str, dict]:
    """Each side's line: its colour, and for a variant of a side (its name with more after it) the same colour
    dashed, dotted, dash-dotted, dash-dot-dotted, then sparsely dotted in the order the variants come."""
    out, seen = {}, {}
    for name in names:
        base = next((k for k in COLOURS if name.startswith(k)), None)
        k = -1
        if base and name != base:
            k = seen[base] = seen.get(base, -1) + 1
        out[name] = {"color": COLOURS.get(base) if base else None,
                     "ls": "-" if k < 0 else VARIANT_LINES[k % len(VARIANT_LINES)]}
    return out


def ours(which: str, game: str, seed: int, frames: int, wall: float, runs: Path, sets: tuple[str, ...] = ()
         ) -> np.ndarray:
    """One run of ours (``sets``: more of its settings): its episodes as rows (seconds since its first env step,
    length, return)."""
    runs.mkdir(parents=True, exist_ok=True)
    # The frame budget ends the run and its schedules span it (agent.schedule_steps = 0: the run's), as Sample
    # Factory's learning rate decays over its budget.
    run_dir, _ = atari.launch_ours(which, game, seed, wall, runs,
                                   sets=(f"run.env_steps={frames // atari.FRAMESKIP}", "agent.schedule_steps=0", *sets))
    first = atari.OUR_JOBS[which][3](run_dir, math.inf)["first_step"]
    tables = []
    for path in sorted(run_dir.glob("*.h5")):
        with h5py.File(path, "r") as f:
            if "episodes" in f and "length" in f["episodes"]:
                tables.append({k: f["episodes"][k][()] for k in ("time", "length", "return")})
    t, length, ret = in_time_order(tables, "length", "return")
    print(f"{which} seed {seed}: {run_dir}, {len(t)} episodes", file=sys.stderr, flush=True)
    return np.column_stack([t - first, length, ret]).astype(float)


def sample_factory(game: str, seed: int, frames: int, wall: float) -> np.ndarray:
    """One run of Sample Factory's APPO (in its venv): its episodes as rows, as :func:`ours` gives them."""
    from mpirl.bench.impala import library
    with tempfile.TemporaryDirectory() as tmp:
        keep = Path(tmp) / "episodes.txt"
        result = library("sample-factory", "sf_run.py", [seed, frames // atari.FRAMESKIP, wall, "inf",
                                                        atari.GAMES[game]], wall, env={"MPIRL_SF_EPISODES": str(keep)})
        rows = np.loadtxt(keep, ndmin=2) if keep.exists() and keep.stat().st_size else np.zeros((0, 3))
    print(f"sf seed {seed}: {len(rows)} episodes, {result['env_steps_sampled'] * atari.FRAMESKIP:,} frames in "
          f"{result['seconds']:.0f} s", file=sys.stderr, flush=True)
    return rows


def stable_baselines(game: str, seed: int, frames: int, wall: float) -> np.ndarray:
    """One run of Stable-Baselines3's PPO with the Zoo's Atari settings (PPO's paper, as ours' PPO job file;
    :mod:`mpirl.bench.refs.sb3_atari`, in this venv): its episodes as rows, as :func:`ours` gives them."""
    with tempfile.TemporaryDirectory() as tmp:
        keep = Path(tmp) / "episodes.txt"
        proc = subprocess.run([sys.executable, "-m", "mpirl.bench.refs.sb3_atari", str(seed),
                               str(frames // atari.FRAMESKIP), str(wall), atari.GAMES[game], str(keep)],
                              capture_output=True, text=True, timeout=wall + 600)
        if proc.returncode:
            raise RuntimeError(f"SB3's run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        rows = np.loadtxt(keep, ndmin=2) if keep.stat().st_size else np.zeros((0, 3))
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"sb3 seed {seed}: {len(rows)} episodes, {result['env_steps_sampled'] * atari.FRAMESKIP:,} frames in "
          f"{result['seconds']:.0f} s", file=sys.stderr, flush=True)
    return rows


def curve(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(frames, hours, mean return of the last WINDOW episodes) at each episode's end from the WINDOW-th on."""
    if len(rows) < WINDOW:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    frames = np.cumsum(rows[:, 1]) * atari.FRAMESKIP
    means = window_means(rows[:, 2], WINDOW)
    return frames[WINDOW - 1:], rows[WINDOW - 1:, 0] / 3600, means


def at(x: np.ndarray, y: np.ndarray, where: float) -> float:
    """The curve's value at the last episode ending at or before ``where`` (NaN before its first)."""
    i = int(np.searchsorted(x, where, side="right")) - 1
    return float(y[i]) if i >= 0 else math.nan


def median(values: list[float]) -> float:
    """The median of the values that are numbers (NaN where none is: no seed reached that point)."""
    kept = [v for v in values if not math.isnan(v)]
    return float(np.median(kept)) if kept else math.nan


Episodes = dict[str, dict[int, np.ndarray]]  # side -> seed -> its episodes' rows


def table(episodes: Episodes) -> str:
    """Return (mean of the last WINDOW episodes; median over seeds) at equal frames and at equal hours."""
    curves = {name: [curve(r) for r in runs.values()] for name, runs in episodes.items()}
    reached = [c for cs in curves.values() for c in cs if len(c[0])]
    if not reached:
        return "no side finished 20 episodes"
    span_f = min(c[0][-1] for c in reached)
    span_h = min(c[1][-1] for c in reached)
    marks = (0.25, 0.5, 1.0)
    width = max(24, *(len(name) + 2 for name in curves))
    head = (f"{'':{width}s}" + "".join(f"{m * span_f / 1e6:>9.2f}M fr" for m in marks)
            + "".join(f"{m * span_h:>10.2f} h" for m in marks) + f"{'episodes':>10s}{'frames':>12s}{'hours':>7s}")
    lines = [f"return, mean of the last {WINDOW} episodes (median over seeds), at equal frames | at equal hours", head]
    def row(label: str, cs: list, runs: list) -> str:
        vals = [median([at(c[0], c[2], m * span_f) if len(c[0]) else math.nan for c in cs]) for m in marks]
        vals += [median([at(c[1], c[2], m * span_h) if len(c[0]) else math.nan for c in cs]) for m in marks]
        total_f = np.median([r[:, 1].sum() * atari.FRAMESKIP for r in runs])
        total_h = np.median([r[-1, 0] / 3600 if len(r) else 0.0 for r in runs])
        return (f"{label:{width}s}" + "".join(f"{v:>12.1f}" for v in vals)
                + f"{np.median([len(r) for r in runs]):>10.0f}{total_f:>12,.0f}{total_h:>7.2f}")

    for name, cs in curves.items():
        runs = list(episodes[name].values())
        lines.append(row(name, cs, runs))
        if len(runs) > 1:  # each seed under the median: the spread the median hides
            lines += [row(f"  seed {seed}", [c], [r]) for (seed, r), c in zip(episodes[name].items(), cs)]
    return "\n".join(lines)


def draw(episodes: Episodes, game: str, out: Path) -> None:
    """Both axes side by side, the legend below them (a variant's name is long: it would cover the curves)."""
    rows_of_legend = len(episodes)
    legend_in = 0.2 * rows_of_legend  # inches of legend under the axes
    fig, (by_frames, by_hours) = plt.subplots(1, 2, figsize=(11, 4 + legend_in), sharey=True)
    line = styles(list(episodes))
    for name, runs in episodes.items():
        for k, rows in enumerate(runs.values()):
            frames, hours, means = curve(rows)
            label = f"{name} ({len(runs)} seed{'s' * (len(runs) > 1)})" if k == 0 else None
            by_frames.plot(frames / 1e6, means, label=label, lw=1.2, **line[name])
            by_hours.plot(hours, means, label=label, lw=1.2, **line[name])
    by_frames.set_xlabel("env frames (millions; frame skip 4)")
    by_hours.set_xlabel("hours since the first env step")
    by_frames.set_ylabel(f"return, mean of the last {WINDOW} games")
    for ax in (by_frames, by_hours):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{game.capitalize()} at 84x84, on the same 2 cores: ours and the libraries'")
    handles, labels = by_frames.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend_in / (4 + legend_in), 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def save(episodes: Episodes, path: Path, **attrs) -> None:
    with h5py.File(path, "w") as f:
        f.attrs.update(attrs)
        for name, runs in episodes.items():
            for seed, rows in runs.items():
                f[f"{name}/seed{seed}"] = rows


def load(path: Path) -> tuple[Episodes, dict]:
    with h5py.File(path, "r") as f:
        return ({name: {int(s[4:]): f[name][s][()] for s in sorted(f[name], key=lambda s: int(s[4:]))}
                 for name in f}, dict(f.attrs))


def merged(ap: argparse.ArgumentParser, paths: list[Path]) -> tuple[Episodes, dict]:
    """The sides and seeds of every file together, with the first file's attributes; refused (``ap.error``, exit 2)
    where a file is missing or unreadable, where two hold one seed of one side, or where their game, frame budget or
    wall differ."""
    episodes: Episodes = {}
    first: dict = {}
    for path in paths:
        try:
            sides, attrs = load(path)
        except (OSError, KeyError, ValueError) as err:
            ap.error(f"--redraw: {path} is not a file this script wrote ({err})")
        if path == paths[0]:
            first = attrs
        differ = [k for k in ("game", "frames", "wall") if str(attrs.get(k)) != str(first.get(k))]
        if differ:
            ap.error(f"--redraw: {path} differs from {paths[0]} in {', '.join(differ)}: not one comparison")
        for name, runs in sides.items():
            twice = sorted(set(runs) & set(episodes.get(name, {})))
            if twice:
                ap.error(f"--redraw: seed {twice[0]} of {name!r} is in two of the files; pass one of them")
            episodes.setdefault(name, {}).update(runs)
            episodes[name] = dict(sorted(episodes[name].items()))
    first["seeds_done"] = min(len(runs) for runs in episodes.values()) if episodes else 0
    return episodes, first


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--game", choices=sorted(atari.GAMES), default="pong")
    ap.add_argument("--frames", type=float, default=4e6, help="env frames a run (agent steps x 4)")
    ap.add_argument("--wall", type=float, default=2400.0, help="seconds a run, from its first env step")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=1, help="the first seed run (a later call adds seeds)")
    ap.add_argument("--which", default="impala,ppo,sf", help="comma-separated: impala, ppo, sf, sb3")
    ap.add_argument("--runs", default="runs/atari-learning", help="where ours' run directories are kept")
    ap.add_argument("--out", help="the PNG (default docs/figures/atari-GAME-learning.png); its data beside it (.h5)")
    ap.add_argument("--redraw", metavar="FILE.h5", nargs="+",
                    help="draw and tabulate the episodes of earlier calls (several: their sides together)")
    ap.add_argument("--set", dest="sets", metavar="KEY=VALUE", action="append", default=[],
                    help="a setting of ours' jobs (repeated; the side is named with them)")
    ap.add_argument("--drop", metavar="SIDE", action="append", default=[],
                    help="with --redraw: leave a side of the files out (repeated)")
    ap.add_argument("--rename", metavar="OLD=NEW", action="append", default=[],
                    help="with --redraw: name a side of the files anew (repeated)")
    args = ap.parse_args(argv)
    for flag, pairs in (("--set", args.sets), ("--rename", args.rename)):
        if any("=" not in p or not p.split("=", 1)[0].strip() or not p.split("=", 1)[1].strip() for p in pairs):
            ap.error(f"{flag}: KEY=VALUE pairs, got {pairs!r}")
    if args.sets and args.redraw:
        ap.error("--set: settings are for new runs, not --redraw (a variant's name is in its file)")
    if (args.rename or args.drop) and not args.redraw:
        ap.error(f"{'--rename' if args.rename else '--drop'}: only with --redraw")
    which = [w.strip() for w in args.which.split(",") if w.strip()]
    if not which or set(which) - set(SIDES):
        ap.error(f"--which: comma-separated names of {', '.join(SIDES)}, got {args.which!r}")
    if args.sets and not set(which) & set(OURS):
        ap.error("--set: settings of ours' jobs, and --which names no side of ours")
    if not (args.frames >= 1e4 and math.isfinite(args.frames)) or not args.wall > 0 or args.seeds < 1 \
            or args.first_seed < 1:
        ap.error("--frames >= 10,000, --wall > 0, --seeds >= 1 and --first-seed >= 1")
    if args.redraw:
        episodes, attrs = merged(ap, [Path(p) for p in args.redraw])
        for side in args.drop:
            if side not in episodes:
                ap.error(f"--drop: {side!r} is not a side of the files; their sides: "
                         f"{', '.join(map(repr, episodes))}")
            del episodes[side]
        for pair in args.rename:
            # a variant's name holds "=" (its --set): OLD ends at the first "=" that leaves a side of the files
            cuts = [i for i, ch in enumerate(pair) if ch == "=" and pair[:i].strip() in episodes]
            old, new = (pair[:cuts[0]].strip(), pair[cuts[0] + 1:].strip()) if cuts else pair.split("=", 1)
            if old not in episodes or new in episodes or not new:
                ap.error(f"--rename: {old!r} is not a side of the files or {new!r} already is; their sides: "
                         f"{', '.join(map(repr, episodes))}")
            episodes = {new if name == old else name: runs for name, runs in episodes.items()}
        game = str(attrs.get("game", args.game))
        out = Path(args.out or Path(args.redraw[0]).with_suffix(".png"))
        if len(args.redraw) > 1 or args.rename or args.drop:
            if out.with_suffix(".h5").exists():
                ap.error(f"--out: {out.with_suffix('.h5')} exists; pass another name for the sides together")
            save(episodes, out.with_suffix(".h5"), **attrs)
    else:
        game = args.game
        out = Path(args.out or f"docs/figures/atari-{game}-learning.png")
        for path in (out, out.with_suffix(".h5")):
            if path.exists():
                ap.error(f"--out: {path} exists; pass another name (results are never overwritten)")
        for w in which:  # a setting ours' jobs refuse is said now, before any run
            if w in OURS and args.sets:
                job = atari.job_file(SIDES[w], game)
                sets = [x for kv in args.sets for x in ("--set", kv)]
                check = subprocess.run([sys.executable, "-m", "mpirl", "validate", str(job), *sets],
                                       capture_output=True, text=True)
                if check.returncode:
                    ap.error(f"--set: {job.name} refuses it: {check.stderr.strip().splitlines()[-1]}")
        variant = f" [{', '.join(args.sets)}]" if args.sets else ""
        named = {w: SIDES[w] + (variant if w in OURS else "") for w in which}
        episodes: Episodes = {named[w]: {} for w in which}
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for w in which:
                got = (sample_factory(game, seed, int(args.frames), args.wall) if w == "sf" else
                       stable_baselines(game, seed, int(args.frames), args.wall) if w == "sb3" else
                       ours(SIDES[w], game, seed, int(args.frames), args.wall, Path(args.runs), tuple(args.sets)))
                episodes[named[w]][seed] = got
            save(episodes, out.with_suffix(".h5"), game=game, frames=args.frames, wall=args.wall,
                 seeds_done=seed - args.first_seed + 1)  # after every seed: a stopped call keeps what it measured
    draw(episodes, game, out)
    print(table(episodes))
    both = not args.redraw or len(args.redraw) > 1 or args.rename or args.drop
    print(f"wrote {out} and {out.with_suffix('.h5')}" if both else f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
