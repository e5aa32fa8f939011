"""The distinct frames of a batch of slots, and where each slot's stack entries sit among them.

A sample reply carries each distinct frame of its batch once, in pool order, and each slot's stacks as
indices into those frames (:meth:`~mpirl.replay.ring.RingStore.gather_framed`). Both come from sorting the
batch's (frame, entry) pairs: equal frames end up side by side, in pool order, and each pair still knows
its entry. The sort is a least-significant-digit radix sort on the frame index, 11 bits a pass (2,048
counters; two passes for pools of up to 4 M frames), so all it touches besides the slots' rows of frame
indices is about 80 KB at batch 512 with stacks of 4 + 4, which stays in the core's caches. (A table with an
entry per pool frame, what this replaces, is 2 MB for an Atari pool, read at random just after a sample's
frame copy has pushed it out of the caches.)
"""
from __future__ import annotations

import numpy as np
from mpirl.replay.compiled import kernel

RADIX_BITS = 11
_ENTRY = (1 << 32) - 1  # the low half of a pair: the entry (row * depth + column)


@kernel
def _distinct_frames(cols, slots, key_bits, uniq, local):  # pragma: no cover - compiled
    """The distinct frame indices of rows ``slots`` of ``cols`` into ``uniq`` (ascending) and, per entry, its
    position among them into ``local`` (flat: ``local[i * d + c]`` is where ``cols[slots[i], c]`` sits in
    ``uniq``); returns their number. ``key_bits``: bits of the largest frame index (frame indices are >= 0)."""
    d = cols.shape[1]
    m = slots.size * d
    pairs = np.empty(m, np.int64)  # frame << 32 | entry
    t = 0
    for i in range(slots.size):
        row = slots[i]
        for c in range(d):
            pairs[t] = (np.int64(cols[row, c]) << 32) | t
            t += 1
    spare = np.empty(m, np.int64)
    count = np.empty(1 << RADIX_BITS, np.int64)
    mask = (1 << RADIX_BITS) - 1
    shift = 32
    while shift < 32 + key_bits:  # one stable counting sort per digit, lowest first
        count[:] = 0
        for t in range(m):
            count[(pairs[t] >> shift) & mask] += 1
        start = 0
        for b in range(mask + 1):
            here = count[b]
            count[b] = start
            start += here
        for t in range(m):
            pair = pairs[t]
            digit = (pair >> shift) & mask
            spare[count[digit]] = pair
            count[digit] += 1
        pairs, spare = spare, pairs
        shift += RADIX_BITS
    n = 0
    last = -1
    for t in range(m):
        pair = pairs[t]
        frame = pair >> 32
        if frame != last:
            uniq[n] = frame
            n += 1
            last = frame
        local[pair & _ENTRY] = n - 1
    return n


def distinct_frames(cols: np.ndarray, slots: np.ndarray, max_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct frames of rows ``slots`` of ``cols`` (int32 ``(capacity, d)`` frame indices in
    ``[0, max_frames)``): ``(uniq, local)``, ``uniq`` int64 ascending, ``local`` int32 ``(len(slots), d)`` with
    ``uniq[local] == cols[slots]``."""
    slots = np.ascontiguousarray(slots, dtype=np.int64)
    uniq = np.empty(len(slots) * cols.shape[1], dtype=np.int64)
    local = np.empty((len(slots), cols.shape[1]), dtype=np.int32)
    n = _distinct_frames(cols, slots, max(1, (int(max_frames) - 1).bit_length()), uniq, local.reshape(-1))
    return uniq[:n], local
