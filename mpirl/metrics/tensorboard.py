"""TensorBoard event files of a run, in ``RUN_DIR/tensorboard/`` beside run.h5 (the ``tensorboard`` extra).

Every table with a ``time`` column becomes scalars, one event per row:

* tags ``<table>/<column>`` for rank 0's files (``train/loss``, ``test/return_mean``); another rank's file adds
  its name (``buffer_1/episodes/return``), and so does a second file of rank 0 whose table name is taken;
* step: the row's ``env_steps``, else ``train_steps`` / ``train_step`` / ``version`` (updates) / ``merges``,
  else the row's index in its table;
* wall time: the run's start plus the row's ``time`` (after a resume, the resume's start plus the time since
  its checkpoint: run.h5's ``resume_<k>_time`` and ``resume_<k>_job_time``);
* left out: ``time`` (the wall time says it), the step's own column, the ids of actors, workers and buffers,
  text, and values that are not finite (a loss before the first batch: no point rather than a nan).

Tables without ``time`` (the learner's ``batches``, a row per train step, whose means are the ``train`` rows) are
left out: TensorBoard keeps 1,000 points of a tag, and TensorBoard's writer computes each event's checksum in
Python (about 1 µs a byte), too much for a row per train step.

Two writers, one output:

* :class:`LiveEvents` (``[log] tensorboard = true``): rank 0 writes its own files' new rows each time one of them
  flushes (every ``log.flush_seconds``, and when it closes), as a hook of :mod:`mpirl.metrics.writer`. It starts by
  removing the event files it finds, so a resumed run writes its whole history again from its tables, whose rows
  after the checkpoint are gone: no point is there twice.
* :func:`export` (``mpirl tensorboard RUN_DIR``): a run that exists, every rank's files, afterwards.

torch.utils.tensorboard is imported when a writer starts, never with this module.
"""
from __future__ import annotations

import datetime as dt
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from mpirl.config import ConfigError
from mpirl.metrics import writer
from mpirl.metrics.run_file import RUN_FILE, load_run, open_h5, read_status, runs_under

EVENTS_DIR = "tensorboard"
EVENTS_PREFIX = "events.out.tfevents."  # the files TensorBoard's writers make; what is removed and rewritten
STEP_COLUMNS = ("env_steps", "train_steps", "train_step", "version", "merges")  # the first present is the step
IDS = ("actor", "worker", "buffer")  # who sent a row: not a quantity to plot
INSTALL = "pip install 'mpirl[tensorboard]'"


def require(key: str, fix: str) -> None:
    """ConfigError(key) unless the tensorboard package imports (the ``tensorboard`` extra); ``fix``: what else."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise ConfigError(key, f"TensorBoard event files need the tensorboard package: {INSTALL}{fix}") from None


def check(cfg) -> None:
    """The job's part: ``[log] tensorboard = true`` needs the package on rank 0 (checked before the roles start)."""
    if cfg.log.tensorboard:
        require("log.tensorboard", " (or set tensorboard = false)")


def event_files(run_dir: Path) -> list[Path]:
    """The run's event files (the ones TensorBoard's writers name ``events.out.tfevents.*``)."""
    return sorted((Path(run_dir) / EVENTS_DIR).glob(EVENTS_PREFIX + "*"))


def remove_events(run_dir: Path) -> None:
    for path in event_files(run_dir):
        path.unlink(missing_ok=True)


def _epoch(iso: Any) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(iso)).timestamp()
    except (TypeError, ValueError):
        return None


def clock(attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """run.h5's root attributes -> ``(starts, zeros)``: the job time from which each start of the run counts (0,
    then each resume's checkpoint) and the epoch at which that start's job time was 0. A resume from an earlier
    job time than one before it (rows after its checkpoint dropped) ends the starts it overlaps."""
    starts, zeros = [0.0], [_epoch(attrs.get("start_time")) or 0.0]
    for k in range(1, int(attrs.get("restarts", 0) or 0) + 1):
        at, job_time = _epoch(attrs.get(f"resume_{k}_time")), attrs.get(f"resume_{k}_job_time")
        if at is None or job_time is None:
            continue
        while len(starts) > 1 and starts[-1] >= float(job_time):
            starts.pop(), zeros.pop()
        starts.append(float(job_time))
        zeros.append(at - float(job_time))
    return np.array(starts), np.array(zeros)


def step_column(columns: Iterable[str]) -> str | None:
    columns = list(columns)
    return next((c for c in STEP_COLUMNS if c in columns), None)


class EventWriter:
    """A SummaryWriter on ``RUN_DIR/tensorboard``: table rows in, one event per row.

    ``attrs``: run.h5's root attributes (the run's starts, for wall times); ``t0``: this start's exact epoch of job
    time 0 (the live writer's; run.h5 keeps start times to the second).
    """

    def __init__(self, run_dir: Path, attrs: Mapping[str, Any], t0: float | None = None):
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter
        self.summary = Summary
        self.writer = SummaryWriter(str(Path(run_dir) / EVENTS_DIR))
        self.starts, self.zeros = clock(attrs)
        if t0 is not None:
            self.zeros[-1] = t0
        self.events = 0
        self.tags: set[str] = set()

    def rows(self, prefix: str, cols: Mapping[str, np.ndarray], first: int) -> None:
        """Rows ``first, first + 1, ...`` of a table (``cols``: its columns, of equal length) under ``prefix/``."""
        if "time" not in cols or not len(cols["time"]):
            return
        times = np.asarray(cols["time"], np.float64)
        by = step_column(cols)
        steps = np.asarray(cols[by]) if by else np.arange(first, first + len(times))
        names = [c for c in cols if c not in ("time", by, *IDS) and np.asarray(cols[c]).dtype.kind in "biuf"]
        if not names:
            return
        values = np.column_stack([np.asarray(cols[c], np.float64) for c in names]).tolist()
        start = np.clip(np.searchsorted(self.starts, times, side="left") - 1, 0, None)
        walls = (self.zeros[start] + times).tolist()
        tags = [f"{prefix}/{c}" for c in names]
        value, events = self.summary.Value, self.writer._get_file_writer()  # one event a row, not one a value
        for step, wall, row in zip(steps.tolist(), walls, values):
            kept = [value(tag=tag, simple_value=v) for tag, v in zip(tags, row) if math.isfinite(v)]
            if kept:
                events.add_summary(self.summary(value=kept), int(step), wall)
                self.events += 1
                self.tags.update(v.tag for v in kept)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class LiveEvents:
    """Rank 0's files as event files while the job runs (``on``: rank 0 of a job with ``[log] tensorboard``; else
    nothing): a flush hook of :mod:`mpirl.metrics.writer` from here to :meth:`close`. Starts by removing the event
    files there are (a resumed run's: it writes them again from its tables)."""

    def __init__(self, run_dir: Path, t0: float, on: bool = True):
        self.run_dir, self.t0 = Path(run_dir), t0
        self.events: EventWriter | None = None
        self.written: dict[tuple[str, str], int] = {}  # (file name, table) -> its rows written
        self.owner: dict[str, str] = {}  # table name -> the file whose tags are <table>/<column>
        if on:
            self._start()
            writer.FLUSH_HOOKS.append(self.flushed)

    def _start(self) -> None:
        remove_events(self.run_dir)
        self.events = EventWriter(self.run_dir, read_status(self.run_dir), self.t0)
        self.written.clear()

    def flushed(self, mf: writer.MetricsFile) -> None:
        """The rows of ``mf`` since the last time, on disk as events (a hook: called after ``mf`` flushes)."""
        if self.events is None:
            return
        try:
            for name, table in mf.tables.items():
                if "time" in table.columns:
                    self._table(mf, name, table)
            self.events.flush()
        except OSError as err:  # the HDF5 files matter more: the job goes on without event files
            print(f"mpirl: tensorboard: cannot write {self.run_dir / EVENTS_DIR} ({err}); no more event files "
                  "(`mpirl tensorboard --force RUN_DIR` writes them from the HDF5 files)", file=sys.stderr, flush=True)
            self.close()

    def _table(self, mf: writer.MetricsFile, name: str, table: writer.Table) -> None:
        key, rows = (mf.path.name, name), table.rows
        if rows < self.written.get(key, 0):
            # Cut after its rows were written (the roles cut a resumed run's tables before their first flush, so
            # this does not happen): the event files start over, every file's rows again at its next flush.
            self.events.close()
            self._start()
        done = self.written.get(key, 0)
        if rows > done:
            owner = self.owner.setdefault(name, mf.path.name)
            prefix = name if owner == mf.path.name else f"{mf.path.stem}/{name}"
            self.events.rows(prefix, {c: ds[done:rows] for c, ds in mf.columns(name).items()}, done)
        self.written[key] = rows

    def close(self) -> None:
        """Stop: the hook removed, the event files closed (the roles have closed their files: every row is in)."""
        if self.flushed in writer.FLUSH_HOOKS:
            writer.FLUSH_HOOKS.remove(self.flushed)
        if self.events is not None:
            self.events.close()
            self.events = None

    def __enter__(self) -> "LiveEvents":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def runs_of(paths: Iterable[Path], force: bool) -> list[Path]:
    """The run directories ``paths`` name (a run directory, or a directory of runs), checked before any is
    written: ConfigError for a path without runs, a missing tensorboard package, a run.h5 that cannot be read (a
    damaged file would give events of nothing), a run directory where the events cannot go, or event files there
    already without ``force``."""
    require("", "")
    runs: list[Path] = []
    for path in paths:
        runs += [run for run in runs_under(path) if run not in runs]
    for run in runs:
        f, note = open_h5(run / RUN_FILE)
        if f is None:
            raise ConfigError("RUN_DIR", f"{run / RUN_FILE} {note}; nothing was written")
        f.close()
        where = run / EVENTS_DIR
        if where.exists() and not where.is_dir():
            raise ConfigError("RUN_DIR", f"{where} is a file, not the directory the event files go in; move it away")
        if not os.access(run, os.W_OK | os.X_OK) or (where.is_dir() and not os.access(where, os.W_OK | os.X_OK)):
            raise ConfigError("RUN_DIR", f"cannot write in {where if where.is_dir() else run}; nothing was written")
        if not force and event_files(run):
            raise ConfigError("", f"{where} holds event files already (the job's, with log.tensorboard, "
                                  "or an earlier export); pass --force to replace them")
    return runs


def export(run_dir: Path) -> str:
    """Event files for the run in ``run_dir`` from every rank's file (the ones there are replaced); a line saying
    what they hold."""
    run_dir = Path(run_dir)
    loaded = load_run(run_dir)
    remove_events(run_dir)
    events = EventWriter(run_dir, loaded["run"]["attrs"])
    owner: dict[str, str] = {}
    try:
        for name, entry in loaded["files"].items():
            rank0 = entry["attrs"].get("rank") == 0
            for table, cols in entry["tables"].items():
                own = rank0 and owner.setdefault(table, name) == name
                events.rows(table if own else f"{name}/{table}", cols, 0)
    finally:
        events.close()
    notes = [f"{name}: {e['note']}" for name, e in loaded["files"].items() if e["note"] not in ("", "ok")]
    return (f"{run_dir / EVENTS_DIR}: {events.events:,} events, {len(events.tags)} tags from "
            f"{len(loaded['files'])} file(s)" + (f" ({'; '.join(notes)})" if notes else ""))
