"""A run's curve as ``mpirl compare`` reads it: its run files' rows made into one ``y`` against one ``x``.

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

A run that cannot be read, or has no returns (or rows) yet, is skipped with a note; a path without any ``run.h5``,
an unknown column or one some runs lack, or an x axis some runs have no counter for raises
:class:`~mpirl.domain.ConfigError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mpirl.domain import ConfigError
from mpirl.metrics.run_file import RUN_FILE, load_run, runs_under
from mpirl.metrics.summary import in_time_order, window_means

# Cumulative env-step counters of one actor or worker each: (table, the column naming whose; None: the file's).
ENV_COUNTERS = (("episodes", "actor"), ("actors", "actor"), ("rollouts", None), ("workers", "worker"))
# A run's train-step counter, the first of these found: (file, table, column).
TRAIN_COUNTERS = (("learner", "train", "train_steps"), ("updates", "updates", "version"))
TAIL = 0.1  # a column's final value: the mean of a run's last 10 % of points


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


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Run directories: each path that holds a ``run.h5``, else every directory below it that does
    (:func:`~mpirl.metrics.run_file.runs_under`), each once."""
    return list(dict.fromkeys(run.resolve() for p in paths for run in runs_under(p)))


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
