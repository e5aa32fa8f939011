"""Append-only HDF5 metrics files, one per writing rank.

A :class:`MetricsFile` holds *tables*: an HDF5 group with one 1-D, chunked,
resizable dataset per column. Rows are appended one at a time (or in blocks) and
the file is flushed at a cadence, so that after ``kill -9`` everything up to the
last flush is readable with plain ``h5py.File(path, 'r')``.

Choices that keep files readable after a crash or while still being written:

* default ``libver`` (not ``'latest'``): no "file is open" flag in the superblock,
  so a killed writer leaves no file that needs ``h5clear``;
* the writer opens the file with ``locking=False``, so readers (``mpirl watch``,
  analysis scripts, ``h5py.File('run.h5')``) can open it while the job runs, and
  file systems without POSIX locks (some NFS/Lustre mounts) work;
* ``flush_if_due()`` flushes when at least ``flush_seconds`` seconds of wall time
  have passed since the last flush; callers call it often (every loop turn).

Example::

    with MetricsFile(run_dir / "learner.h5", {"role": "learner", "rank": 0}) as mf:
        train = mf.table("train", {"time": np.float64, "loss": np.float32})
        train.append(time=1.0, loss=0.5)
        mf.flush_if_due()
"""
from __future__ import annotations

import json
import time
from os import PathLike
from pathlib import Path
from typing import Any, Callable, Mapping

import h5py
import numpy as np

CHUNK_ROWS = 1024  # rows per HDF5 chunk (a chunk of float64 is 8 KiB)
# Called with a MetricsFile of this process after each flush that may carry rows (flush, flush_if_due, close): rank
# 0's TensorBoard mirror (mpirl/metrics/tensorboard.py, ``[log] tensorboard``) adds one while its job runs.
FLUSH_HOOKS: list[Callable[["MetricsFile"], None]] = []


def to_attr(value: Any) -> Any:
    """Convert a Python value into something h5py stores as an attribute.

    str/int/float/bool and numpy scalars pass through; None becomes ""; lists and
    tuples of strings or numbers become arrays; dicts become a JSON string.
    """
    if value is None:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return np.bool_(value)
    if isinstance(value, (str, int, float, np.number)):
        return value
    if isinstance(value, PathLike):
        return str(value)
    if isinstance(value, Mapping):
        return json.dumps(value, default=str, sort_keys=True)
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return np.array(value, dtype=h5py.string_dtype())
        try:
            return np.asarray(value)
        except (TypeError, ValueError):
            return json.dumps(value, default=str)
    return str(value)


def set_attrs(obj: h5py.HLObject, kv: Mapping[str, Any]) -> None:
    """Store every item of ``kv`` as an attribute of ``obj`` (see :func:`to_attr`)."""
    for key, value in kv.items():
        obj.attrs[str(key)] = to_attr(value)


class Table:
    """One group of equal-length 1-D column datasets; rows are appended at the end."""

    def __init__(self, group: h5py.Group, columns: Mapping[str, Any],
                 units: Mapping[str, str] | None = None):
        if not columns:
            raise ValueError(f"table {group.name!r} needs at least one column")
        self.name = group.name.lstrip("/")
        self._cols: dict[str, h5py.Dataset] = {}
        if len(group):  # a table of a resumed run: continue it
            if sorted(group) != sorted(columns):
                raise ValueError(f"table {self.name!r} has columns {sorted(group)}, not {sorted(columns)}")
            self._cols = {col: group[col] for col in columns}
            self._rows = min(len(ds) for ds in self._cols.values())  # a crash may leave them uneven
            self.truncate(self._rows)
            return
        for col, dtype in columns.items():
            dt = np.dtype(dtype)
            if dt.kind in "OUS":
                dt = h5py.string_dtype()
            ds = group.create_dataset(col, shape=(0,), maxshape=(None,), dtype=dt,
                                      chunks=(CHUNK_ROWS,))
            if units and col in units:
                ds.attrs["units"] = units[col]
            self._cols[col] = ds
        self._rows = 0

    @property
    def rows(self) -> int:
        """Number of rows appended so far (all columns have this length)."""
        return self._rows

    @property
    def columns(self) -> list[str]:
        """Column names in creation order."""
        return list(self._cols)

    def truncate(self, rows: int) -> None:
        """Keep the first ``rows`` rows (a resumed run drops what came after its checkpoint)."""
        rows = max(0, min(int(rows), self._rows))
        for ds in self._cols.values():
            ds.resize((rows,))
        self._rows = rows

    def rows_until(self, column: str, value: float) -> int:
        """Rows from the start whose ``column`` (non-decreasing, e.g. time) is ``<= value``."""
        return int(np.searchsorted(self._cols[column][:self._rows], value, side="right"))

    def _check(self, given: Mapping[str, Any]) -> None:
        missing = [c for c in self._cols if c not in given]
        extra = [c for c in given if c not in self._cols]
        if missing:
            raise ValueError(f"table {self.name!r}: missing column(s) {', '.join(missing)}")
        if extra:
            raise ValueError(f"table {self.name!r}: unknown column(s) {', '.join(extra)}")

    def append(self, **values: Any) -> None:
        """Append one row; every column must be given, by name."""
        self._check(values)
        n = self._rows
        for col, ds in self._cols.items():
            ds.resize((n + 1,))
            ds[n] = values[col]
        self._rows = n + 1

    def extend(self, **arrays: Any) -> None:
        """Append many rows: one equal-length 1-D array (or list) per column."""
        self._check(arrays)
        data = {c: np.asarray(a).reshape(-1) for c, a in arrays.items()}
        lengths = {len(a) for a in data.values()}
        if len(lengths) != 1:
            raise ValueError(f"table {self.name!r}: columns have unequal lengths "
                             f"{ {c: len(a) for c, a in data.items()} }")
        k = lengths.pop()
        if k == 0:
            return
        n = self._rows
        for col, ds in self._cols.items():
            ds.resize((n + k,))
            ds[n:n + k] = data[col]
        self._rows = n + k


class MetricsFile:
    """A new HDF5 file of tables, flushed at a cadence.

    Args:
        path: file to create; an existing file is never overwritten
            (:class:`FileExistsError`).
        attrs: attributes for the root group (e.g. ``role``, ``rank``).
        flush_seconds: minimum wall-clock seconds between flushes done by
            :meth:`flush_if_due`.
        resume: continue the existing file of a resumed run instead: asking for
            a table returns the stored one (same columns), appending after its rows.
    """

    def __init__(self, path: str | PathLike, attrs: Mapping[str, Any] | None = None,
                 flush_seconds: float = 2.0, resume: bool = False):
        self.path = Path(path)
        if resume and not self.path.exists():
            resume = False  # killed before its file was made: start it
        if self.path.exists() and not resume:
            raise FileExistsError(f"{self.path} exists; metrics files are never overwritten")
        self.flush_seconds = float(flush_seconds)
        self._file: h5py.File | None = h5py.File(self.path, "r+" if resume else "w-", locking=False)
        self._tables: dict[str, Table] = {}
        if attrs:
            set_attrs(self._file, attrs)
        self._sync()  # the header on disk before the rank's first real work: the file opens after any death

    @property
    def closed(self) -> bool:
        return self._file is None

    def _open_file(self) -> h5py.File:
        if self._file is None:
            raise ValueError(f"{self.path} is closed")
        return self._file

    def table(self, name: str, columns: Mapping[str, Any],
              units: Mapping[str, str] | None = None) -> Table:
        """Create table ``name`` with ``columns`` (name -> numpy dtype).

        ``units`` (column -> unit string, e.g. ``{"time": "s"}``) is stored as each
        dataset's ``units`` attribute. Asking again for an existing table with the
        same columns returns it; different columns raise ValueError.
        """
        f = self._open_file()
        if name in self._tables:
            table = self._tables[name]
            if table.columns != list(columns):
                raise ValueError(f"table {name!r} exists with columns {table.columns}")
            return table
        table = Table(f[name] if name in f else f.create_group(name), columns, units)
        self._tables[name] = table
        self._sync()  # tables are made at start: on disk at once, so a crash before the first row leaves them
        return table

    @property
    def tables(self) -> dict[str, Table]:
        """The tables asked for so far, by name."""
        return dict(self._tables)

    def columns(self, name: str) -> dict[str, h5py.Dataset]:
        """The datasets of table ``name`` (for reading back a resumed run's last rows)."""
        return dict(self._tables[name]._cols)

    def set_attrs(self, **kv: Any) -> None:
        """Set attributes on the root group."""
        set_attrs(self._open_file(), kv)

    def _sync(self) -> None:
        """Flush without the hooks: the header and new tables (a resumed run's roles cut a table after making it,
        so a hook first sees it cut)."""
        self._open_file().flush()
        self._last_flush = time.monotonic()

    def flush(self) -> None:
        """Write everything appended so far to disk (and hand the file to :data:`FLUSH_HOOKS`)."""
        self._sync()
        for hook in FLUSH_HOOKS:
            hook(self)

    def flush_due(self) -> bool:
        """Whether ``flush_seconds`` have passed since the last flush."""
        return self._file is not None and time.monotonic() - self._last_flush >= self.flush_seconds

    def group(self, name: str) -> h5py.Group:
        """A new group ``name`` of the file (for arrays written once, such as a final table); a resumed run's
        file may hold one from before: it is replaced."""
        f = self._open_file()
        if name in f and name not in self._tables:
            del f[name]
        return f.create_group(name)

    def flush_if_due(self) -> bool:
        """Flush if ``flush_seconds`` have passed since the last flush; True if it did."""
        if self._file is None or time.monotonic() - self._last_flush < self.flush_seconds:
            return False
        self.flush()
        return True

    def close(self) -> None:
        """Flush and close; calling it again does nothing."""
        if self._file is not None:
            try:
                self._file.flush()
                for hook in FLUSH_HOOKS:
                    hook(self)
            finally:
                self._file.close()
                self._file = None

    def __enter__(self) -> "MetricsFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Rows:
    """Rows of one table gathered in lists and appended in blocks (at a flush), not one HDF5 resize a row."""

    def __init__(self, table: Table):
        self.table = table
        self.cols: dict[str, list] = {c: [] for c in table.columns}

    def add(self, **row) -> None:
        for c, v in row.items():
            self.cols[c].append(v)

    def extend(self, **cols) -> None:
        for c, v in cols.items():
            self.cols[c].extend(np.asarray(v).tolist())

    def write(self) -> None:
        if self.cols["time"]:
            self.table.extend(**self.cols)
            self.cols = {c: [] for c in self.cols}
