"""FIFO record storage: one preallocated numpy array per field of the record spec.

A *spec* maps a field name to ``(per_record_shape, dtype)``, e.g. for DQN on
CartPole::

    {"obs": ((4,), np.float32), "action": ((), np.int64),
     "reward": ((), np.float32), "next_obs": ((4,), np.float32),
     "done": ((), np.bool_), "discount": ((), np.float32)}

Field arrays have shape ``(capacity, *shape)`` and keep the spec's dtype
(uint8 frames stay uint8).  Slots fill from 0 upward; once full, the oldest
record is overwritten (FIFO).  Each slot carries a *version*: the global
insertion number of the record currently in it (``-1`` = never written), so a
sampled ``(slot, version)`` pair can tell whether the slot was overwritten.

With ``dedup_frames`` the uint8 frame-stack fields (Atari's obs and next_obs)
are not stored as stacks: each slot keeps int32 indices into one shared
:class:`~mpirl.replay.frames.FramePool` that holds every distinct frame once,
and ``gather``/``export`` rebuild the stacks. Callers see the same records.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from mpirl.replay.compiled import kernel

from .batch_frames import distinct_frames
from .frames import FramePool, framed_fields

if TYPE_CHECKING:
    from .frame_cache import CacheMirror

Spec = Mapping[str, tuple[tuple[int, ...], np.dtype]]
NOT_HELD, OVER_RELEASED = -1, -2


@kernel
def _place_frames(cols, versions, ids, new, refs, take, dead):  # pragma: no cover - compiled
    """``cols[ids[i]] = new[i]``: take a reference per entry of ``new`` (if ``take``), then release the
    references of the slots' previous records (``versions >= 0``). Frames left with none go to ``dead``;
    returns their number, or NOT_HELD / OVER_RELEASED (then nothing changed)."""
    n, d = new.shape
    if take:
        for i in range(n):
            for c in range(d):
                if refs[new[i, c]] <= 0:
                    return NOT_HELD
        for i in range(n):
            for c in range(d):
                refs[new[i, c]] += 1
    for i in range(n):
        if versions[ids[i]] >= 0:
            for c in range(d):
                if refs[cols[ids[i], c]] <= 0:
                    return OVER_RELEASED  # unreachable while counts are kept right; checked before any change
    nd = 0
    for i in range(n):
        s = ids[i]
        if versions[s] >= 0:
            for c in range(d):
                f = cols[s, c]
                refs[f] -= 1
                if refs[f] == 0:
                    dead[nd] = f
                    nd += 1
        for c in range(d):
            cols[s, c] = new[i, c]
    return nd


class RingStore:
    """Fixed-capacity FIFO of records.

    Attributes:
        capacity: number of slots.
        size: number of filled slots (``<= capacity``).
        inserted: total records ever passed to :meth:`add` (never reset, also
            not by :meth:`clear`, so versions stay unique for the store's life).
        versions: int64 ``(capacity,)``, insertion number of each slot's record.
        fields: ``{name: array (capacity, *shape) of dtype}``.
    """

    def __init__(self, spec: Spec, capacity: int, dedup_frames: bool = False, stream_frames: int = 0) -> None:
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not spec:
            raise ValueError("spec has no fields")
        self.spec = {name: (tuple(shape), np.dtype(dtype))
                     for name, (shape, dtype) in spec.items()}
        self.capacity = capacity
        self.framed = framed_fields(self.spec) if dedup_frames else {}
        self.fields = {name: np.zeros((capacity, *shape), dtype=dtype)
                       for name, (shape, dtype) in self.spec.items() if name not in self.framed}
        # Every frame-stack field's indices side by side in one array (one row a slot), each field a view of it.
        self.frame_cols = np.zeros((capacity, sum(depth for depth, _ in self.framed.values())), dtype=np.int32)
        self.frame_idx, col = {}, 0
        for name, (depth, _) in self.framed.items():
            self.frame_idx[name] = self.frame_cols[:, col:col + depth]
            col += depth
        self.pool = None
        if self.framed:
            shapes = {shape for _, shape in self.framed.values()}
            if len(shapes) > 1:
                raise ValueError(f"frame-stack fields with different frame shapes: {sorted(shapes)}")
            depth = sum(d for d, _ in self.framed.values())
            # Room for no sharing at all, plus the frames senders' windows hold (frame_stream.FrameWindows).
            self.pool = FramePool(shapes.pop(), capacity * depth + int(stream_frames))
        self.versions = np.full(capacity, -1, dtype=np.int64)
        self.size = 0
        self.inserted = 0
        self._head = 0  # next slot to write

    def clear(self) -> None:
        """Forget every record (field memory is kept, not zeroed)."""
        if self.pool is not None:
            self.pool.clear()
        self.versions.fill(-1)
        self.size = 0
        self._head = 0

    def add(self, records: Mapping[str, np.ndarray]) -> np.ndarray:
        """Append ``n`` records; returns the int64 slot ids written, in order.

        ``records``: ``{name: array (n, *shape)}`` for every spec field (cast
        to the field dtype on copy).  If ``n > capacity`` only the last
        ``capacity`` records are kept.  Return contract: ``ids[i]`` holds input
        row ``n - len(ids) + i``, i.e. the kept rows are always the LAST
        ``len(ids)`` input rows, so a caller with a per-row array ``a`` of
        length n applies ``a[n - len(ids):]`` (equal to ``a`` unless n >
        capacity).
        """
        n = self.count_rows(records)
        skip = n - min(n, self.capacity)
        if self.framed:  # found by content; each use holds a reference from here on
            new = np.concatenate([self.pool.intern(np.asarray(records[name][skip:], dtype=np.uint8).reshape(-1, *shape))
                                  .reshape(-1, depth) for name, (depth, shape) in self.framed.items()], axis=1)
        ids, _ = self._write_plain(records, n)
        if self.framed:
            self._place_frames(ids, new, take=False)
        self._advance(ids, skip, n)
        return ids

    def add_framed(self, records: Mapping[str, np.ndarray], frames: np.ndarray) -> np.ndarray:
        """Append records whose frame stacks come as indices into ``frames`` (a dump's layout).

        ``records``: the plain fields plus ``<name>_idx`` (n, depth) int32 for each
        frame-stack field, indexing ``frames`` (F, *frame_shape), in which each
        distinct frame appears once. Returns the slot ids as :meth:`add` does.
        """
        n = len(records[f"{next(iter(self.framed))}_idx"])
        skip = n - min(n, self.capacity)  # rows overwritten at once: their frames are not kept
        local = np.concatenate([np.asarray(records[f"{name}_idx"][skip:]).reshape(-1)
                                for name in self.framed]).astype(np.int64)
        used = np.flatnonzero(np.bincount(local, minlength=len(frames)))
        where = np.zeros(len(frames), dtype=np.int32)
        where[used] = self.pool.adopt(frames[used], np.ones(len(used), np.int32))  # held while the slots take theirs
        ids = self.add_indexed(records, {name: where[np.asarray(records[f"{name}_idx"])] for name in self.framed})
        self.pool.release(where[used])
        return ids

    def add_indexed(self, records: Mapping[str, np.ndarray], frame_idx: Mapping[str, np.ndarray]) -> np.ndarray:
        """Append records whose frame stacks are frames the pool already holds.

        ``records``: the plain fields; ``frame_idx``: per frame-stack field (n, depth) pool
        indices. Each use takes a reference (a sender's window holds the frames meanwhile,
        see :class:`~mpirl.replay.frame_stream.FrameWindows`). Returns the slot ids as
        :meth:`add` does.
        """
        n = len(next(iter(frame_idx.values())))
        skip = n - min(n, self.capacity)
        new = np.concatenate([np.asarray(frame_idx[name][skip:]) for name in self.framed], axis=1).astype(np.int32)
        ids, _ = self._write_plain(records, n)
        self._place_frames(ids, new, take=True)
        self._advance(ids, skip, n)
        return ids

    def _place_frames(self, ids: np.ndarray, new: np.ndarray, take: bool) -> None:
        """Slots ``ids`` get frame indices ``new`` (rows of every field's indices side by side): their
        references are taken (``take``; else the caller took them), then the overwritten slots' released."""
        dead = np.empty(new.size, dtype=np.int64)
        n = _place_frames(self.frame_cols, self.versions, ids, new, self.pool.refs, take, dead)
        if n == NOT_HELD:
            raise RuntimeError("a reference taken to a frame that is not held")
        if n == OVER_RELEASED:
            raise RuntimeError("frame released more often than referenced")
        self.pool.free(dead[:n])

    def _write_plain(self, records: Mapping[str, np.ndarray], n: int) -> tuple[np.ndarray, int]:
        """Copy the plain fields of the rows that will be kept; returns (slot ids, rows skipped).

        The frames of the slots about to be overwritten are released by :meth:`_place_frames`."""
        cap = self.capacity
        m = min(n, cap)
        skip = n - m  # leading input rows that would be overwritten at once
        start = (self._head + skip) % cap
        first = min(m, cap - start)  # rows before the wrap-around
        for name, field in self.fields.items():
            src = records[name]
            field[start:start + first] = src[skip:skip + first]
            if first < m:
                field[:m - first] = src[skip + first:]
        ids = np.arange(start, start + m, dtype=np.int64)
        if first < m:
            ids[first:] -= cap
        return ids, skip

    def _advance(self, ids: np.ndarray, skip: int, n: int) -> None:
        cap = self.capacity
        self.versions[ids] = np.arange(self.inserted + skip, self.inserted + n,
                                       dtype=np.int64)
        self.inserted += n
        self._head = (self._head + n) % cap
        self.size = min(cap, self.size + n)

    def count_rows(self, records: Mapping[str, np.ndarray]) -> int:
        """Number of rows in ``records``; checks fields and per-record shapes."""
        missing = self.spec.keys() - records.keys()
        if missing:
            raise KeyError(f"records lack fields {sorted(missing)}")
        n = None
        for name, (shape, _) in self.spec.items():
            arr = records[name]
            if np.shape(arr)[1:] != shape:
                raise ValueError(f"field {name!r}: rows of shape {np.shape(arr)[1:]}, "
                                 f"spec says {shape}")
            if n is None:
                n = len(arr)
            elif len(arr) != n:
                raise ValueError(f"field {name!r} has {len(arr)} rows, expected {n}")
        return int(n)

    @property
    def nbytes(self) -> int:
        """Bytes held: every field's rows, the slot versions and, with frames stored once,
        the frame indices and the pool memory in use (see :class:`FramePool`)."""
        held = sum(a.nbytes for a in self.fields.values()) + self.versions.nbytes
        if self.pool is not None:
            held += sum(a.nbytes for a in self.frame_idx.values()) + self.pool.resident_nbytes
        return held

    def gather(self, ids: np.ndarray, out: Mapping[str, np.ndarray]) -> None:
        """Copy rows ``ids`` of every field into preallocated ``out[name]``.

        ``ids``: int array (k,) of filled slots.  ``out[name]``: array with
        at least k rows, shape ``(>=k, *shape)``, the field's dtype, C-contiguous;
        rows ``0..k-1`` are written (zero allocation: ``np.take(out=,
        mode='clip')``).  Raises IndexError if an id is not a filled slot.
        """
        ids = self._gather_plain(ids, out)
        for name, idx in self.frame_idx.items():
            np.take(self.pool.frames, idx[ids], axis=0, out=out[name][:len(ids)], mode="clip")

    def _gather_plain(self, ids: np.ndarray, out: Mapping[str, np.ndarray]) -> np.ndarray:
        """The plain fields of rows ``ids`` into ``out``; returns ``ids`` as int64 (IndexError: not filled)."""
        ids = np.asarray(ids, dtype=np.int64)
        k = len(ids)
        if k and (ids.min() < 0 or ids.max() >= self.size):
            raise IndexError(f"ids outside filled slots [0, {self.size})")
        for name, field in self.fields.items():
            np.take(field, ids, axis=0, out=out[name][:k], mode="clip")
        return ids

    def export(self, out: Mapping[str, np.ndarray]) -> int:
        """Copy all filled rows, oldest first, into ``out[name][:n]``; returns n.

        ``out[name]``: preallocated array with at least ``size`` rows.
        """
        n = self._export_plain(out)
        if self.framed:
            order = self.oldest_first()
            for name, idx in self.frame_idx.items():
                np.take(self.pool.frames, idx[order], axis=0, out=out[name][:n], mode="clip")
        return n

    def _export_plain(self, out: Mapping[str, np.ndarray]) -> int:
        n = self.size
        # When full, the oldest record sits at the write head; else at slot 0.
        start = self._head if n == self.capacity else 0
        tail = n - start
        for name, field in self.fields.items():
            dst = out[name]
            dst[:tail] = field[start:n]
            dst[tail:n] = field[:start]
        return n

    def export_framed(self, out: Mapping[str, np.ndarray], frames_out: np.ndarray) -> tuple[int, int]:
        """Like :meth:`export`, with each distinct frame once: returns (records, frames).

        ``out`` holds the plain fields and ``<name>_idx`` (>= size, depth) int32 per
        frame-stack field; the frames they index go to ``frames_out[:frames]``.
        """
        n = self._export_plain(out)
        return n, self._frames_once(self.oldest_first(), out, frames_out)

    def gather_framed(self, ids: np.ndarray, out: Mapping[str, np.ndarray], frames_out: np.ndarray,
                      mirror: CacheMirror | None = None) -> int:
        """Like :meth:`gather`, with each distinct frame of the rows once (a sample reply's layout).

        ``out`` holds the plain fields and ``<name>_idx`` int32 per frame-stack field; the frames
        they index go to ``frames_out`` in pool order. Returns the number of frames. With the learner's
        frame cache (``mirror``), only the frames it does not hold go, the indices point into its table, and
        ``out["frame_slots"]`` says where each sent frame is kept (:mod:`mpirl.replay.frame_cache`).
        """
        return self._frames_once(self._gather_plain(ids, out), out, frames_out, mirror)

    def _frames_once(self, slots: np.ndarray, out: Mapping[str, np.ndarray], frames_out: np.ndarray,
                     mirror: CacheMirror | None = None) -> int:
        """The frames of ``slots`` once each into ``frames_out`` (sorted by pool index, so the copy walks the
        pool one way) and each slot's stacks as indices into them in ``out['<name>_idx']``."""
        k = len(slots)
        uniq, local = distinct_frames(self.frame_cols, slots, self.pool.max_frames)
        if mirror is not None:
            place, uniq, install = mirror.split(uniq, self.pool.generation)
            local = place[local]
            out["frame_slots"][:len(uniq)] = install
        n = len(uniq)
        np.take(self.pool.frames, uniq, axis=0, out=frames_out[:n], mode="clip")
        pos = 0
        for name, (depth, _) in self.framed.items():
            out[f"{name}_idx"][:k] = local[:, pos:pos + depth]
            pos += depth
        return n

    def oldest_first(self) -> np.ndarray:
        """Slot ids of the filled rows, oldest first (int64, (size,))."""
        start = self._head if self.size == self.capacity else 0
        return (np.arange(self.size, dtype=np.int64) + start) % self.capacity
