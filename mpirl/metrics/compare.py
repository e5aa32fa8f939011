"""Seeds together: runs of one job that differ in their seed, side by side (``mpirl compare``).

Runs are grouped by their job settings without the seed (``run.seed``, ``run.name``, ``run.out_dir``) and without
the keys the caller names (the command line passes what a resumed job may change: stop limits, ``log.*``,
``checkpoint.*``, the device). A group's label names the settings that differ between the groups
(``replay.architecture=baseline``); a lone group is labelled by its env and algorithm.

What is compared (``y``):

* ``return``: every rank file's ``episodes`` table (the buffers' in the actor-learner family, the workers' in the
  gradient family, the Q-server's in the exchange family) in time order. A run's curve is the mean of every
  ``run.return_window`` consecutive episodes (the last actor's alone where ``run.return_from = "least_exploring"``),
  its final value the last of them: the mean return of its last ``run.return_window`` episodes.
* a column, ``FILE.TABLE.COLUMN`` or a shorter name that is unique: ``TABLE.COLUMN`` or ``FILE.COLUMN`` (``FILE``
  without its rank: ``learner``, ``buffer``, ``worker``, ``updates``, ``qserver``). A table kept by several files
  (one per buffer or worker) counts as their mean; a run's final value is the mean of its last 10 % of points.

Against (``x``): ``env_steps`` (summed over every actor or worker, from their own counters), ``train_steps`` (the
learner's, or the parameter server's updates) or ``time`` (seconds since the job started).

A group's curve is the median over its runs with their interquartile range as a band, on a grid of 200 points
over the x range every run of the group covers. Runs of different length (a run that stops at its target return
ends early) are cut to the shortest: the part past it is drawn per run, faint, with no median.

Final values: per group its runs', their median, their interquartile mean (rliable's IQM, ``scipy.stats.trim_mean(x,
0.25)``: ``n // 4`` runs cut at each end, so with fewer than 4 runs none is cut and the IQM is the mean) and a 95 %
percentile bootstrap interval of the IQM (the runs resampled with replacement by a seeded numpy Generator).

Bad input raises :class:`~mpirl.domain.ConfigError` (the command prints one line, exit 2): a path without any
``run.h5``, an output file that exists (without ``force``), an unknown column or one some runs lack, an x axis
some runs have no counter for. A run that cannot be read, or has no returns (or rows) yet, is skipped with a note:
a directory of runs may hold one just starting or broken, and the others still compare.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mpirl.domain import ConfigError
from mpirl.metrics.run_file import RUN_FILE, load_run
from mpirl.metrics.summary import in_time_order, window_means

SEED_KEYS = ("run.seed", "run.name", "run.out_dir")  # what tells seeds of one job apart
X_LABELS = {"env_steps": "env steps (summed over all actors or workers)", "train_steps": "train steps",
            "time": "wall time since the job started [s]"}
# Cumulative env-step counters of one actor or worker each: (table, the column naming whose; None: the file's).
ENV_COUNTERS = (("episodes", "actor"), ("actors", "actor"), ("rollouts", None), ("workers", "worker"))
# A run's train-step counter, the first of these found: (file, table, column).
TRAIN_COUNTERS = (("learner", "train", "train_steps"), ("updates", "updates", "version"))
GRID = 200  # points of a group's median curve
RESAMPLES = 2000  # bootstrap resamples of a group's runs
TAIL = 0.1  # a column's final value: the mean of a run's last 10 % of points
LABEL_KEYS = 3  # settings named in a group's label at most
INSTALL = "pip install 'mpirl[analysis]'"


@dataclass
class Clock:
    """A counter against time: ``time`` [s since the job started], increasing, and the ``count`` reached by then
    (from 0 at time 0); linear between records."""
    time: np.ndarray
    count: np.ndarray

    @classmethod
    def of(cls, time: np.ndarray, count: np.ndarray) -> Clock:
        time, count = np.asarray(time, float), np.asarray(count, float)
        if not len(time) or time[0] > 0:
            time, count = np.r_[0.0, time], np.r_[0.0, count]
        return cls(time, count)

    def at(self, t: np.ndarray) -> np.ndarray:
        return np.interp(t, self.time, self.count)

    def when(self, count: np.ndarray) -> np.ndarray:
        return np.interp(count, self.count, self.time)


@dataclass
class Run:
    """One run as compared: its directory, its flat job, its curve (``x``, ``y``, x increasing) and final value."""
    path: Path
    job: dict[str, Any]
    x: np.ndarray
    y: np.ndarray
    final: float

    @property
    def seed(self) -> str:
        return str(self.job.get("run.seed", self.path.name))


@dataclass
class Group:
    """Runs whose jobs differ only in the seed (and the ignored keys); ``label`` names what sets it apart."""
    settings: dict[str, str]
    runs: list[Run] = field(default_factory=list)
    label: str = ""

    def band(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``grid, q25, median, q75`` over the x range every run covers (empty arrays when they share none)."""
        lo, hi = max(r.x[0] for r in self.runs), min(r.x[-1] for r in self.runs)
        if not hi > lo:
            return (np.zeros(0),) * 4
        grid = np.linspace(lo, hi, GRID)
        q25, median, q75 = np.percentile([np.interp(grid, r.x, r.y) for r in self.runs], [25, 50, 75], axis=0)
        return grid, q25, median, q75


@dataclass
class Comparison:
    """What :func:`compare` made: the groups, the table of final values as text, the notes (skipped runs) and the
    PNG written."""
    groups: list[Group]
    table: str
    notes: list[str]
    out: Path


def iqm(values: Sequence[float]) -> float:
    """rliable's interquartile mean: the mean after ``n // 4`` values are cut at each end (the plain mean for
    fewer than 4 values), as ``scipy.stats.trim_mean(values, 0.25)``."""
    x = np.sort(np.asarray(values, float))
    k = len(x) // 4
    return float(x[k:len(x) - k].mean())


def iqm_interval(values: Sequence[float], seed: int, resamples: int = RESAMPLES,
                 level: float = 0.95) -> tuple[float, float]:
    """A ``level`` percentile bootstrap interval of the IQM: ``resamples`` draws of ``n`` values with replacement
    (one ``resamples x n`` matrix from ``np.random.default_rng(seed)``), the IQM of each, its percentiles."""
    x = np.asarray(values, float)
    n, k = len(x), len(x) // 4
    draws = np.sort(x[np.random.default_rng(seed).integers(0, n, size=(resamples, n))], axis=1)
    lo, hi = np.percentile(draws[:, k:n - k].mean(axis=1), [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Run directories: each path that holds a ``run.h5``, else every directory below it that does."""
    found: dict[Path, None] = {}
    for p in map(Path, paths):
        if (p / RUN_FILE).is_file():
            found[p] = None
            continue
        below = sorted(f.parent for f in p.rglob(RUN_FILE)) if p.is_dir() else []
        if not below:
            why = "does not exist" if not p.exists() else f"has no {RUN_FILE}, here or below"
            raise ConfigError("RUN_DIR", f"{p} {why}; pass run directories or directories holding runs")
        found.update(dict.fromkeys(below))
    return list(dict.fromkeys(p.resolve() for p in found))


def _role(name: str) -> str:
    """A rank file's name without its rank: ``buffer_1`` -> ``buffer``."""
    return re.sub(r"_\d+$", "", name)


def catalogue(files: dict[str, dict]) -> set[str]:
    """Every numeric column of a run with rows, as ``FILE.TABLE.COLUMN`` (tables with a ``time`` or ``train_step``)."""
    out: set[str] = set()
    for name, entry in files.items():
        for table, cols in entry["tables"].items():
            rows = cols.get("time", cols.get("train_step", ()))
            out.update(f"{_role(name)}.{table}.{c}" for c, a in cols.items()
                       if len(rows) and c not in ("time", "train_step") and a.dtype.kind in "biuf")
    return out


def resolve(spec: str, runs: list[tuple[Path, dict, dict]]) -> str:
    """The ``FILE.TABLE.COLUMN`` every run has that ``spec`` names (in full, ``TABLE.COLUMN`` or ``FILE.COLUMN``)."""
    every = set.intersection(*(catalogue(files) for _, _, files in runs))
    anywhere = set.union(*(catalogue(files) for _, _, files in runs))

    def named(full: str) -> bool:
        role, table, col = full.split(".", 2)
        return spec in (full, f"{table}.{col}", f"{role}.{col}")

    hits = sorted(c for c in anywhere if named(c))
    shared = [c for c in hits if c in every]
    timed = [c for c in shared if all(_timed(c, files) for _, _, files in runs)]
    if len(shared) == 1 or len(timed) == 1:  # learner.loss: the train rows' (in time), not the batches' (by step)
        return shared[0] if len(shared) == 1 else timed[0]
    if len(shared) > 1:
        raise ConfigError("--y", f"{spec!r} names {len(shared)} columns: {', '.join(shared)}; pass one in full")
    lacking = [str(p) for p, _, files in runs if not set(hits) & catalogue(files)]
    if lacking and hits:
        raise ConfigError("--y", f"{hits[0]} is not in {len(lacking)} of the {len(runs)} runs (e.g. {lacking[0]}: "
                                 f"another algorithm?); columns every run has: {_listing(every)}")
    if hits:
        raise ConfigError("--y", f"{spec!r} names {', '.join(hits)}, none of them in every run; columns every run "
                                 f"has: {_listing(every)}")
    raise ConfigError("--y", f"no column {spec!r}; 'return', or one of the columns every run has: {_listing(every)}")


def _timed(column: str, files: dict[str, dict]) -> bool:
    """Whether the column's table has a ``time`` column in the run's files."""
    role, table, _ = column.split(".", 2)
    return any("time" in e["tables"].get(table, {}) for name, e in files.items() if _role(name) == role)


def _listing(columns: set[str]) -> str:
    """Columns grouped by table: ``learner.train: loss, p_s; buffer.episodes: return``."""
    tables: dict[str, list[str]] = {}
    for c in sorted(columns):
        t, _, col = c.rpartition(".")
        tables.setdefault(t, []).append(col)
    return "; ".join(f"{t}: {', '.join(cols)}" for t, cols in tables.items()) or "none"


def env_clock(files: dict[str, dict]) -> Clock | None:
    """Env steps summed over every actor or worker against time, each counted by its own latest count."""
    sources: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for name, entry in files.items():
        for table, whose in ENV_COUNTERS:
            t = entry["tables"].get(table, {})
            if not len(t.get("time", ())) or "env_steps" not in t or (whose and whose not in t):
                continue
            if whose is None:
                sources.setdefault(f"file {name}", []).append((t["time"], t["env_steps"]))
                continue
            for who in np.unique(t[whose]):
                mine = t[whose] == who
                sources.setdefault(f"{whose} {who}", []).append((t["time"][mine], t["env_steps"][mine]))
    if not sources:
        return None
    times, steps = [], []
    for parts in sources.values():
        t = np.concatenate([p[0] for p in parts]).astype(float)
        order = np.argsort(t, kind="stable")
        count = np.maximum.accumulate(np.concatenate([p[1] for p in parts]).astype(float)[order])
        times.append(t[order])
        steps.append(np.diff(count, prepend=0.0))
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    return Clock.of(t[order], np.cumsum(np.concatenate(steps)[order]))


def train_clock(files: dict[str, dict]) -> Clock | None:
    """The learner's train steps (or the parameter server's updates) against time."""
    for name, table, col in TRAIN_COUNTERS:
        t = files.get(name, {}).get("tables", {}).get(table, {})
        if len(t.get("time", ())) and col in t:
            return Clock.of(t["time"], t[col])
    return None


def _returns(job: dict, files: dict[str, dict]) -> tuple[np.ndarray, np.ndarray]:
    """Episode times and returns of every file's ``episodes`` table in time order (the last actor's alone for
    ``run.return_from = "least_exploring"``)."""
    tables = [e["tables"].get("episodes", {}) for e in files.values()]
    if job.get("run.return_from") == "least_exploring" and any("actor" in t for t in tables):
        t, ret, actor = in_time_order(tables, "return", "actor")
        keep = actor == actor.max() if len(actor) else np.zeros(0, bool)
        return t[keep], ret[keep].astype(float)
    t, ret = in_time_order(tables, "return")
    return t, ret.astype(float)


def _series(column: str, files: dict[str, dict]) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """``(time or train step, value, by_step)`` of the column in every file holding it, finite values only."""
    role, table, col = column.split(".", 2)
    out = []
    for name, entry in sorted(files.items()):
        t = entry["tables"].get(table, {})
        if _role(name) != role or col not in t:
            continue
        by_step = "time" not in t
        at, v = np.asarray(t["train_step" if by_step else "time"], float), np.asarray(t[col], float)
        ok = np.isfinite(v)
        if ok.any():
            out.append((at[ok], v[ok], by_step))
    return out


def _mean_curve(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Several files' curves of one run as one: their mean where each has data, on every x any of them has."""
    if len(curves) == 1:
        return curves[0]
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    ys = [np.where((grid >= x[0]) & (grid <= x[-1]), np.interp(grid, x, y), np.nan) for x, y in curves]
    return grid, np.nanmean(ys, axis=0)


def _clock(x: str, path: Path, files: dict[str, dict]) -> Clock | None:
    """The run's counter for the ``x`` axis (None: ``time``, the rows' own); ConfigError when it has none."""
    if x == "time":
        return None
    clock = env_clock(files) if x == "env_steps" else train_clock(files)
    if clock is None:
        where = (", ".join(f"{t}.env_steps" for t, _ in ENV_COUNTERS) if x == "env_steps"
                 else ", ".join(f"{f}.{t}.{c}" for f, t, c in TRAIN_COUNTERS))
        raise ConfigError("--x", f"{path} has no {x.replace('_', ' ')} counter ({where}); use another --x")
    return clock


def curve(path: Path, job: dict, files: dict[str, dict], y: str, x: str) -> Run | str:
    """The run's curve of ``y`` (``return`` or a resolved ``FILE.TABLE.COLUMN``) against ``x``, or why it has none."""
    clock = _clock(x, path, files)

    def to_x(t: np.ndarray) -> np.ndarray:
        return np.asarray(t, float) if clock is None else clock.at(t)

    if y == "return":
        window = int(job.get("run.return_window") or 20)
        t, ret = _returns(job, files)
        if len(ret) < window:
            return f"{path}: {len(ret)} episode(s) so far, fewer than run.return_window = {window}; skipped"
        means = window_means(ret, window)
        return Run(path, job, to_x(t[window - 1:]), means, float(means[-1]))
    curves = []
    for at, v, by_step in _series(y, files):
        if by_step and x == "train_steps":
            curves.append((at, v))
            continue
        train = _clock("train_steps", path, files) if by_step else None
        if train is not None:  # rows by train step (the learner's batches): their time from the train-step counter
            at = train.when(at)
        curves.append((to_x(at), v))
    if not curves:
        return f"{path}: no rows of {y} yet; skipped"
    cx, cy = _mean_curve(curves)
    tail = cy[-max(1, int(np.ceil(len(cy) * TAIL))):]
    return Run(path, job, cx, cy, float(tail.mean()))


def read_runs(paths: Sequence[str | Path], y: str, x: str) -> tuple[list[Run], list[str], str]:
    """Every run below ``paths`` with its curve, a note for each run skipped, and ``y`` resolved (a column in full)."""
    loaded, notes = [], []
    for path in find_runs(paths):
        data = load_run(path)
        run = data["run"]
        if run["note"] != "ok" or not run["job"]:
            notes.append(f"{path}: {RUN_FILE} {run['note'] if run['note'] != 'ok' else 'holds no job'}; skipped")
            continue
        loaded.append((path, run["job"], data["files"]))
    if loaded and y != "return":
        y = resolve(y, loaded)
    runs = []
    for path, job, files in loaded:
        got = curve(path, job, files, y, x)
        if isinstance(got, str):
            notes.append(got)
        else:
            runs.append(got)
    if not runs:
        raise ConfigError("RUN_DIR", f"no run to compare: {len(notes)} skipped ({notes[0] if notes else 'none found'})")
    return runs, notes, y


def group_runs(runs: list[Run], ignore: Sequence[str] = SEED_KEYS, ignore_sections: Sequence[str] = ()) -> list[Group]:
    """Runs grouped by their settings but ``ignore`` (keys) and ``ignore_sections`` (key prefixes), labelled."""
    groups: dict[tuple, Group] = {}
    for run in sorted(runs, key=lambda r: (r.seed, str(r.path))):
        settings = {k: repr(v) for k, v in sorted(run.job.items())
                    if k not in ignore and not k.startswith(tuple(ignore_sections))}
        groups.setdefault(tuple(settings.items()), Group(settings)).runs.append(run)
    out = list(groups.values())
    for g, label in zip(out, _labels(out)):
        g.label = label
    return sorted(out, key=lambda g: g.label)


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _labels(groups: list[Group]) -> list[str]:
    """Each group's settings that differ between the groups (``agent.algorithm`` first; keys only some groups have
    go unnamed when the algorithm differs: they follow from it); a lone group: its env and algorithm."""
    if len(groups) == 1:
        job = groups[0].runs[0].job
        return [f"{job.get('env.id', '?')} {job.get('agent.algorithm', '?')}"]
    keys = sorted(set().union(*(g.settings for g in groups)), key=lambda k: (k != "agent.algorithm", k))
    differ = [k for k in keys if len({g.settings.get(k) for g in groups}) > 1]
    if "agent.algorithm" in differ:
        differ = [k for k in differ if k == "agent.algorithm" or all(k in g.settings for g in groups)]
    more = f" (+{len(differ) - LABEL_KEYS} more)" if len(differ) > LABEL_KEYS else ""
    labels = [", ".join(f"{k}={_value(g.runs[0].job.get(k, '-'))}" for k in differ[:LABEL_KEYS]) + more
              for g in groups]
    return [f"{label} #{i + 1}" if labels.count(label) > 1 else label for i, label in enumerate(labels)]


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def y_label(y: str, runs: list[Run]) -> str:
    """The y axis's name: the column in full, or the return with its window."""
    if y != "return":
        return y
    windows = {int(r.job.get("run.return_window") or 20) for r in runs}
    return f"return (mean of the last {windows.pop() if len(windows) == 1 else 'run.return_window'} episodes)"


def draw(groups: list[Group], ylabel: str, x: str, out: Path) -> None:
    """One PNG: per group each run faint, the median over its runs with their interquartile band, n in the legend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, g in enumerate(groups):
        color = f"C{i % 10}"
        for r in g.runs:
            ax.plot(r.x, r.y, color=color, alpha=0.3, lw=0.8)
        ax.plot([r.x[-1] for r in g.runs], [r.y[-1] for r in g.runs], "o", color=color, ms=4, alpha=0.7)
        label = f"{g.label} (n={len(g.runs)})"
        if len(g.runs) == 1:  # its own curve, no band
            ax.plot(g.runs[0].x, g.runs[0].y, color=color, lw=2, label=label)
            continue
        grid, q25, median, q75 = g.band()
        ax.fill_between(grid, q25, q75, color=color, alpha=0.25, lw=0)
        ax.plot(grid, median, color=color, lw=2, label=label if grid.size else f"{label}: runs share no x range")
    ax.set(xlabel=X_LABELS[x], ylabel=ylabel)
    if x != "time":  # counts as 200k, 1.5M
        ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
    ax.set_title("line and band: median and 25-75 % of each group's runs, where all of them have data\n"
                 "faint: each run, a dot at its end", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def format_table(groups: list[Group], y: str, x: str, seed: int) -> str:
    """The final values per group: n, median, IQM, its bootstrap interval, where the runs ended (the median of their
    last x) and every run's value, then what they mean."""
    heads = ("group", "n", "median", "IQM", "95 % CI of IQM", f"ended at ({x})", "each run (seed value)")
    rows = []
    for g in groups:
        finals = [r.final for r in g.runs]
        lo, hi = iqm_interval(finals, seed)
        rows.append((g.label, str(len(finals)), _num(float(np.median(finals))), _num(iqm(finals)),
                     f"[{_num(lo)}, {_num(hi)}]", _num(float(np.median([r.x[-1] for r in g.runs]))),
                     "  ".join(f"s{r.seed} {_num(r.final)}" for r in g.runs)))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in (0, 6) else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    what = (f"{y_label(y, [r for g in groups for r in g.runs])} at each run's end" if y == "return"
            else f"{y}, the mean of each run's last {TAIL:.0%} of points")
    out = [f"final value: {what}; ended at: the median {x} of the runs' last points", line(heads),
           *(line(r) for r in rows),
           f"IQM: the mean of the middle 50 % of a group's runs (n // 4 cut at each end); 95 % CI: percentile "
           f"bootstrap of the IQM, {RESAMPLES:,} resamples of the runs, seed {seed}"]
    if any(len(g.runs) < 4 for g in groups):
        out.append("note: a group of fewer than 4 runs cuts none: its IQM is the mean of its runs"
                   + ("; a lone run's interval is its own value" if any(len(g.runs) == 1 for g in groups) else ""))
    return "\n".join(out)


def check_out(out: Path, force: bool) -> None:
    """The PNG can be written: a ``.png`` name in a directory that exists, new unless ``force``."""
    if out.suffix.lower() != ".png":
        raise ConfigError("--out", f"a .png file name, got {str(out)!r}")
    if not out.parent.is_dir():
        raise ConfigError("--out", f"{out.parent} is not a directory; make it first or pass another --out")
    if out.exists() and not force:
        raise ConfigError("--out", f"{out} exists; pass --force to overwrite it, or another --out")


def compare(paths: Sequence[str | Path], y: str = "return", x: str = "env_steps", out: Path = Path("compare.png"),
            force: bool = False, seed: int = 0, ignore: Sequence[str] = SEED_KEYS,
            ignore_sections: Sequence[str] = ()) -> Comparison:
    """Read the runs below ``paths``, group them, draw ``out`` and tabulate the final values (see the module doc).

    ``ignore``: job keys that do not set a group apart (the seed's, and what a resumed job may change);
    ``ignore_sections``: key prefixes likewise (``"log."``). Bad input raises ConfigError before ``out`` is written.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("", f"drawing the comparison needs matplotlib, which is not installed: {INSTALL}") from None
    if x not in X_LABELS:
        raise ConfigError("--x", f"one of {', '.join(X_LABELS)}, got {x!r}")
    check_out(Path(out), force)
    runs, notes, y = read_runs(paths, y, x)
    groups = group_runs(runs, ignore, ignore_sections)
    draw(groups, y_label(y, runs), x, Path(out))
    return Comparison(groups, format_table(groups, y, x, seed), notes, Path(out))
