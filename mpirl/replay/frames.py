"""Frames stored once: a content-addressed, reference-counted pool of image frames.

An Atari transition carries two stacks of 4 frames (obs and next_obs), but
consecutive transitions of one game share all but one frame: transition t's
next_obs is frames t+n-3..t+n, transition t+1's obs is frames t-2..t+1. Storing
stacks costs 8 frames (56 KB) per slot; storing each distinct frame once and
8 int32 indices per slot costs about one frame (7 KB) per slot.

Frames come in two ways. In a job they arrive once from their sender, already
numbered (:mod:`mpirl.replay.frame_stream`): ``adopt`` copies them in and slots
take references by index; nothing looks for duplicates. Records handed over as
whole stacks (``RingStore.add``) go through ``intern``, which finds duplicates by
content, so it needs no knowledge of which actor, game or time step a frame came
from: a 64-bit fingerprint of the frame's bytes picks a candidate and a byte
comparison confirms it (a fingerprint collision stores the frame again; it never
aliases two different frames). Each frame counts the references to it; when a
slot is overwritten its references are released and frames nobody references
go back to a free list.

Memory is reserved for the worst case (no frame shared at all: ``max_frames``)
but only touched as frames are used: the free list hands out the lowest free
index first and ``numpy.zeros`` maps untouched pages lazily, so the resident
size follows the live frames (``resident_nbytes``).
"""

from __future__ import annotations

import numpy as np
from mpirl.replay.compiled import kernel

_MULT_SEED = 0x6D70_6972  # fixed: fingerprints must agree between runs of the same data


class FramePool:
    """Up to ``max_frames`` frames of ``frame_shape`` uint8, each held once with a reference count."""

    def __init__(self, frame_shape: tuple[int, ...], max_frames: int):
        self.frame_shape = tuple(frame_shape)
        self.max_frames = int(max_frames)
        self.frames = np.zeros((self.max_frames, *self.frame_shape), dtype=np.uint8)
        self.refs = np.zeros(self.max_frames, dtype=np.int32)
        self.keys = np.zeros(self.max_frames, dtype=np.uint64)
        # Bumped each time an index is handed out: (index, generation) names one frame for the pool's lifetime
        # (the learner's frame cache keys on it, mpirl.replay.frame_cache).
        self.generation = np.zeros(self.max_frames, dtype=np.int64)
        self.frame_nbytes = int(np.prod(self.frame_shape, dtype=np.int64))
        # Free list as a stack whose top is the lowest index: frames fill the pool from 0 up.
        self._free = np.arange(self.max_frames - 1, -1, -1, dtype=np.int64)
        self._top = self.max_frames
        self._index: dict[int, int] = {}  # fingerprint -> frame holding that content
        self.high_water = 0  # frames ever touched: what the pool costs in RAM
        words = self.frame_nbytes // 8 if self.frame_nbytes % 8 == 0 else self.frame_nbytes
        rng = np.random.default_rng(_MULT_SEED)
        self._mult = rng.integers(1, 2**63, size=words, dtype=np.uint64) | np.uint64(1)

    # -- sizes -------------------------------------------------------------------
    @property
    def live(self) -> int:
        """Frames referenced by at least one slot."""
        return self.max_frames - self._top

    @property
    def resident_nbytes(self) -> int:
        """Bytes of pool memory in use: touched frames plus their counters and fingerprints."""
        return self.high_water * (self.frame_nbytes + self.refs.itemsize + self.keys.itemsize)

    # -- content -----------------------------------------------------------------
    def fingerprints(self, frames: np.ndarray) -> np.ndarray:
        """uint64 fingerprint of each frame in ``frames`` (m, *frame_shape): a random linear form of its words.

        Multiplying by odd numbers modulo 2**64 keeps a difference's lowest bit in place, so
        frames that differ only in the top byte of some words may share a fingerprint. That
        costs a duplicate frame (matches are always confirmed byte for byte), never an alias.
        """
        flat = np.ascontiguousarray(frames).reshape(len(frames), -1)
        words = flat.view(np.uint64) if self.frame_nbytes % 8 == 0 else flat.astype(np.uint64)
        return np.matmul(words, self._mult)  # integer matmul: a C loop, wraps modulo 2**64

    def _alloc_many(self, n: int) -> np.ndarray:
        """``n`` free frames, lowest indices first (int64)."""
        if n > self._top:
            raise MemoryError(f"frame pool full ({self.max_frames} frames)")
        idx = self._free[self._top - n:self._top][::-1].copy()
        self._top -= n
        self.generation[idx] += 1
        if n:
            self.high_water = max(self.high_water, int(idx.max()) + 1)
        return idx

    def intern(self, frames: np.ndarray) -> np.ndarray:
        """Take one reference to each of ``frames`` (m, *frame_shape); returns their int32 indices.

        A frame whose content is already in the pool reuses that frame; others are copied in.
        Vectorized over the batch: one fingerprint per frame, frames repeated within the batch
        grouped by fingerprint, one index lookup per distinct frame. Every match is confirmed
        byte for byte (within the batch and against the pool); if two different frames of one
        batch share a fingerprint, the batch goes frame by frame instead.
        """
        m = len(frames)
        if m == 0:
            return np.zeros(0, dtype=np.int32)
        flat = np.ascontiguousarray(frames).reshape(m, -1)
        keys = self.fingerprints(flat)
        uniq, first, inv = np.unique(keys, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        rep = first[inv]  # the first frame of the batch with the same fingerprint
        dup = np.flatnonzero(rep != np.arange(m))
        if dup.size:
            raw = {i: flat[i].tobytes() for i in np.union1d(dup, rep[dup]).tolist()}
            if not all(raw[i] == raw[j] for i, j in zip(dup.tolist(), rep[dup].tolist())):
                return self._intern_one_by_one(flat, keys)
        # One lookup per distinct frame; a hit counts only if the pool's frame has the same bytes.
        index, pool = self._index, self.frames.reshape(self.max_frames, -1)
        js = np.array([index.get(k, -1) for k in uniq.tolist()], dtype=np.int64)
        for h in np.flatnonzero(js >= 0).tolist():
            if pool[js[h]].tobytes() != flat[first[h]].tobytes():
                js[h] = -1  # a fingerprint collision: store this content as a frame of its own
        new = np.flatnonzero(js < 0)
        if new.size:
            slots = self._alloc_many(len(new))
            pool[slots] = flat[first[new]]
            self.keys[slots] = uniq[new]
            for key, j in zip(uniq[new].tolist(), slots.tolist()):
                index.setdefault(key, j)
            js[new] = slots
        self.refs[js] += np.bincount(inv, minlength=len(uniq)).astype(np.int32)
        return js[inv].astype(np.int32)

    def _intern_one_by_one(self, flat: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """:meth:`intern` for a batch in which different frames share a fingerprint."""
        out = np.empty(len(flat), dtype=np.int32)
        index, pool, refs = self._index, self.frames.reshape(self.max_frames, -1), self.refs
        for i in range(len(flat)):
            key = int(keys[i])
            j = index.get(key)
            if j is not None and np.array_equal(pool[j], flat[i]):
                refs[j] += 1
            else:
                j = int(self._alloc_many(1)[0])
                pool[j] = flat[i]
                refs[j] = 1
                self.keys[j] = key
                index.setdefault(key, j)
            out[i] = j
        return out

    def adopt(self, frames: np.ndarray, refs: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
        """Copy ``frames`` (in ``order``, if given) in as new frames with the given reference counts;
        returns their indices (of ``frames[order]``, if given).

        For frames whose sender stored or sent each once (a message, a baseline dump): no content lookup.
        """
        idx = self._alloc_many(len(frames))
        if len(idx):
            if idx[-1] - idx[0] == len(idx) - 1:  # the common case, a run of free frames: one block copy
                if order is None:
                    self.frames[idx[0]:idx[-1] + 1] = frames
                else:
                    np.take(frames, order, axis=0, out=self.frames[idx[0]:idx[-1] + 1])
            else:
                self.frames[idx] = frames if order is None else frames[order]
            self.refs[idx] = refs
            self.keys[idx] = 0
        return idx.astype(np.int32)

    def retain(self, idx: np.ndarray) -> None:
        """Take one more reference per entry of ``idx`` (repeats allowed) to frames already held."""
        idx = np.ascontiguousarray(idx, dtype=np.int32).reshape(-1)
        if _retain(self.refs, idx) < 0:
            raise RuntimeError("a reference taken to a frame that is not held")

    def release(self, idx: np.ndarray) -> None:
        """Drop one reference per entry of ``idx`` (repeats allowed); free frames left unreferenced."""
        idx = np.ascontiguousarray(idx, dtype=np.int32).reshape(-1)
        if not len(idx):
            return
        dead = np.empty(len(idx), np.int64)
        n = _release(self.refs, idx, dead)
        if n < 0:
            raise RuntimeError("frame released more often than referenced")
        self.free(dead[:n])

    def free(self, dead: np.ndarray) -> None:
        """Put frames nobody refers to any more (their counts are 0) back on the free list."""
        n = len(dead)
        if not n:
            return
        dead = np.sort(dead)
        if self._index:  # frames found by content (intern) leave the index
            index = self._index
            for j, key in zip(dead.tolist(), self.keys[dead].tolist()):
                if index.get(key) == j:
                    del index[key]
        # Push the highest first so the lowest freed index is reused first.
        self._free[self._top:self._top + n] = dead[::-1]
        self._top += n

    def clear(self) -> None:
        """Forget every frame (memory already touched stays mapped)."""
        self.refs.fill(0)
        self._index.clear()
        self._free = np.arange(self.max_frames - 1, -1, -1, dtype=np.int64)
        self._top = self.max_frames


@kernel
def _retain(refs, idx):  # pragma: no cover - compiled
    """One more reference per entry of ``idx``; -1 (nothing changed) if one is not held."""
    for i in range(idx.size):
        if refs[idx[i]] <= 0:
            return -1
    for i in range(idx.size):
        refs[idx[i]] += 1
    return 0


@kernel
def _release(refs, idx, dead):  # pragma: no cover - compiled
    """One reference less per entry of ``idx``; the frames left with none go to ``dead``. Returns their
    number, or -1 (nothing changed) if a frame would be released more often than referenced."""
    for i in range(idx.size):
        refs[idx[i]] -= 1
    bad = False
    for i in range(idx.size):
        if refs[idx[i]] < 0:
            bad = True
    if bad:
        for i in range(idx.size):
            refs[idx[i]] += 1
        return -1
    n = 0
    for i in range(idx.size):
        if refs[idx[i]] == 0:
            refs[idx[i]] = -1  # marks it listed once; set back to 0 below
            dead[n] = idx[i]
            n += 1
    for i in range(n):
        refs[dead[i]] = 0
    return n


def framed_fields(spec: dict) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Fields of ``spec`` that are uint8 stacks of frames: name -> (stack depth, frame shape).

    A field of shape (S, H, W) and dtype uint8 (Atari's frame stacks) qualifies;
    every such field shares one pool, so obs and next_obs reuse each other's frames.
    """
    out = {}
    for name, (shape, dtype) in spec.items():
        if np.dtype(dtype) == np.uint8 and len(shape) == 3:
            out[name] = (int(shape[0]), tuple(int(s) for s in shape[1:]))
    return out
