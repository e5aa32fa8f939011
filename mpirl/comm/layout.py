"""Message layouts: a batch of records plus a small header in one contiguous byte buffer.

A message for ``n`` rows is the float64 header followed by one block per field
holding that field's ``n`` rows contiguously (columnar, each block 8-byte
aligned). The first header slot is always ``rows``, so a receiver reads ``n``
from the header and builds zero-copy views over the same bytes. Only the bytes
of the ``n`` rows are sent: a short message costs what it holds.

A layout may also have *counted* fields whose row count is not the message's:
each keeps its own count in a header slot ``<name>_rows`` and follows the row
fields (a baseline dump carries N slots and the F distinct frames they share).

No MPI here: layouts are plain numpy and are tested without a communicator.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

ALIGN = 8


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


class Layout:
    """Header slots (name -> length in float64s) + row fields (name -> (shape, dtype)).

    ``max_rows`` bounds the rows a message may carry; ``max_nbytes`` is the size of
    a buffer that can hold any message of this layout.
    """

    def __init__(self, header: dict[str, int], fields: dict[str, tuple[tuple, np.dtype]], max_rows: int,
                 counted: dict[str, tuple[tuple, np.dtype, int]] | None = None):
        counted = counted or {}
        self.counted = {name: (tuple(shape), np.dtype(dtype), int(most)) for name, (shape, dtype, most) in counted.items()}
        self.header_slots: dict[str, slice] = {}
        pos = 0
        for name, length in {"rows": 1, **header, **{f"{c}_rows": 1 for c in self.counted}}.items():
            self.header_slots[name] = slice(pos, pos + length)
            pos += length
        self.header_len = pos
        self.fields = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in fields.items()}
        self.row_nbytes = {name: int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                           for name, (shape, dt, *_) in {**self.fields, **self.counted}.items()}
        self.max_rows = int(max_rows)
        self.max_nbytes = self.nbytes(self.max_rows, **{c: most for c, (_, _, most) in self.counted.items()})
        # Views made lately, by (buffer address, size, rows, counts): messages reuse a few buffers and sizes.
        self._views: dict[tuple, tuple[np.ndarray, dict]] = {}

    def nbytes(self, rows: int, **counts: int) -> int:
        """Bytes of a message carrying ``rows`` records (and ``counts`` rows of counted fields)."""
        return self._offsets(rows, tuple(counts.get(c, 0) for c in self.counted))[1]

    @lru_cache(maxsize=64)
    def _offsets(self, rows: int, counts: tuple = ()) -> tuple[dict[str, int], int]:
        offsets, pos = {}, self.header_len * 8
        for name in self.fields:
            offsets[name] = pos
            pos = _aligned(pos + rows * self.row_nbytes[name])
        for name, n in zip(self.counted, counts):
            offsets[name] = pos
            pos = _aligned(pos + n * self.row_nbytes[name])
        return offsets, pos

    def buffer(self) -> np.ndarray:
        """A zeroed byte buffer large enough for any message of this layout."""
        return np.zeros(self.max_nbytes, dtype=np.uint8)

    def header(self, buf: np.ndarray) -> np.ndarray:
        """The float64 header of ``buf`` as a writable view."""
        return buf[: self.header_len * 8].view(np.float64)

    def get(self, buf: np.ndarray, name: str) -> np.ndarray:
        """One header slot: a scalar for length-1 slots, else a float64 view."""
        h = self.header(buf)[self.header_slots[name]]
        return float(h[0]) if h.size == 1 else h

    def slot_length(self, name: str) -> int:
        """How many float64 values header slot ``name`` holds."""
        sl = self.header_slots[name]
        return sl.stop - sl.start

    def set(self, buf: np.ndarray, **values) -> None:
        """Write header slots by name (scalars or sequences up to the slot length)."""
        h = self.header(buf)
        for name, value in values.items():
            sl = self.header_slots[name]
            if np.ndim(value) == 0:
                h[sl.start] = value
            else:
                value = np.asarray(value, dtype=np.float64)
                h[sl.start: sl.start + value.size] = value

    def rows(self, buf: np.ndarray) -> int:
        return int(self.header(buf)[0])

    def views(self, buf: np.ndarray, rows: int | None = None, **counts: int) -> dict[str, np.ndarray]:
        """Zero-copy ``(rows, *shape)`` views of every field; ``rows`` defaults to the header's.

        Counted fields get ``counts[name]`` rows, by default their header slot's count.
        """
        rows = self.rows(buf) if rows is None else rows
        n = tuple(int(counts[c]) if c in counts else int(self.get(buf, f"{c}_rows")) for c in self.counted)
        key = (buf.__array_interface__["data"][0], len(buf), rows, n)
        got = self._views.get(key)
        if got is not None and got[0] is buf:  # the same buffer (a ring's or a pool's) at the same counts
            return dict(got[1])
        offsets, _ = self._offsets(rows, n)
        out = {}
        for name, (shape, dt) in self.fields.items():
            start = offsets[name]
            out[name] = buf[start: start + rows * self.row_nbytes[name]].view(dt).reshape((rows, *shape))
        for (name, (shape, dt, _)), k in zip(self.counted.items(), n):
            start = offsets[name]
            out[name] = buf[start: start + k * self.row_nbytes[name]].view(dt).reshape((k, *shape))
        if len(self._views) >= 256:
            self._views.pop(next(iter(self._views)))
        self._views[key] = (buf, out)
        return dict(out)

    def pack(self, buf: np.ndarray, records: dict[str, np.ndarray], **header) -> int:
        """Copy ``records`` (equal-length arrays per field) and header values into ``buf``.

        Counted fields are not packed: pass their counts as header values (``frames_rows=n``)
        and fill their views afterwards. Returns the message size in bytes.
        """
        rows = len(next(iter(records.values()))) if records else 0
        if rows > self.max_rows:
            raise ValueError(f"{rows} rows exceed this layout's max_rows={self.max_rows}")
        counts = {c: int(header.pop(f"{c}_rows", 0)) for c in self.counted}
        self.set(buf, rows=rows, **header, **{f"{c}_rows": n for c, n in counts.items()})
        if rows:
            views = self.views(buf, rows, **counts)
            for name in self.fields:
                views[name][...] = records[name]
        return self.nbytes(rows, **counts)
