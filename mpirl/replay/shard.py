"""Proportional prioritized replay shard (Schaul et al. 2016, as used by Ape-X).

A :class:`PrioritizedShard` is a :class:`~mpirl.replay.ring.RingStore` (FIFO
record storage) plus a :class:`~mpirl.replay.sumtree.SumTree` holding
``p_i = (|delta_i| + eps) ** alpha`` per slot.  Sampling probability of slot i
is ``P(i) = p_i / sum_j p_j``.  Priority feedback is versioned: an update only
lands on a slot that still holds the record that was sampled.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple

import numpy as np
from numba import njit

from .ring import RingStore, Spec
from .sumtree import SumTree, _update_sorted

UNSORTED, OUT_OF_RANGE, NOT_FINITE = -1, -2, -3


@njit(cache=True, nogil=True)
def _apply_feedback(tree, size, slot_versions, raw_priority, ids, versions, priorities,
                    eps, alpha):  # pragma: no cover - compiled
    """The learner's new priorities for one sampled batch, in one pass.

    ``ids`` non-decreasing (a repeated id: its last value wins). Where the slot
    still holds the sampled version: ``raw_priority[id] = |priority|`` and the
    tree leaf ``(|priority| + eps) ** alpha``. Returns the number of stale ids,
    or a negative code (nothing written): UNSORTED, OUT_OF_RANGE, NOT_FINITE.
    """
    n = ids.size
    for i in range(n):
        if i and ids[i] < ids[i - 1]:
            return UNSORTED
        if ids[i] < 0 or ids[i] >= raw_priority.size:
            return OUT_OF_RANGE
        if not np.isfinite(priorities[i]):
            return NOT_FINITE
    leaves = np.empty(n, np.int64)
    values = np.empty(n, np.float64)
    m = stale = 0
    for i in range(n):
        slot, version = ids[i], versions[i]
        if version < 0 or slot_versions[slot] != version:  # -1 = empty slot
            stale += 1
            continue
        raw = abs(priorities[i])
        raw_priority[slot] = raw
        if m and leaves[m - 1] == slot:
            m -= 1
        leaves[m] = slot
        values[m] = (np.float64(raw) + eps) ** alpha
        m += 1
    _update_sorted(tree, size, leaves[:m], values[:m])
    return stale


@njit(cache=True, nogil=True)
def _insert_priorities(tree, size, raw_priority, ids, priorities, eps, alpha):  # pragma: no cover - compiled
    """Priorities of newly written slots ``ids`` (one ascending run, or two where the ring wrapped):
    ``raw_priority[id] = |p|`` and the tree leaf ``(|p| + eps) ** alpha``. Returns 1 (nothing written)
    if a priority is not finite, else 0."""
    n = ids.size
    for i in range(n):
        if not np.isfinite(priorities[i]):
            return 1
    values = np.empty(n, np.float64)
    split = n
    for i in range(n):
        raw = abs(priorities[i])
        raw_priority[ids[i]] = raw
        values[i] = (np.float64(raw) + eps) ** alpha
        if i and split == n and ids[i] < ids[i - 1]:
            split = i
    _update_sorted(tree, size, ids[:split], values[:split])
    if split < n:
        _update_sorted(tree, size, ids[split:], values[split:])
    return 0


class Sample(NamedTuple):
    """One sampled batch of k items (all arrays have shape (k,)).

    ids: int64 slot ids.  versions: int64 slot versions at sampling time (send
    back with the new priorities).  probs: float64 ``P(i) = p_i / total``
    within this shard.  priorities: float32 raw (pre-alpha) priorities.
    """
    ids: np.ndarray
    versions: np.ndarray
    probs: np.ndarray
    priorities: np.ndarray
    frames: int = 0  # with frames stored once: distinct frames written to the reply (sample_into)


class PrioritizedShard:
    """Replay memory of ``capacity`` records with proportional prioritization.

    Args:
        spec: record spec ``{name: (shape, dtype)}`` (see ``ring.py``).
        capacity: number of slots.
        alpha: prioritization exponent (0 = uniform).
        eps: added to raw priorities so no stored record has p = 0.

    Attributes:
        store: the RingStore (``store.fields`` holds the records).
        tree: the SumTree of ``p = (raw + eps) ** alpha``.
        raw_priority: float32 ``(capacity,)`` raw priority per slot.
    """

    def __init__(self, spec: Spec, capacity: int, alpha: float, eps: float = 1e-6,
                 dedup_frames: bool = False, stream_frames: int = 0) -> None:
        if alpha < 0 or eps < 0:
            raise ValueError("alpha and eps must be >= 0")
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.store = RingStore(spec, capacity, dedup_frames, stream_frames)
        self.tree = SumTree(capacity)
        self.raw_priority = np.zeros(self.store.capacity, dtype=np.float32)
        self._arange: np.ndarray = np.arange(0, dtype=np.float64)  # grown on demand

    # -- sizes ---------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.store.capacity

    @property
    def size(self) -> int:
        """Number of filled slots."""
        return self.store.size

    @property
    def total(self) -> float:
        """Sum of ``p^alpha`` over filled slots."""
        return self.tree.total

    @property
    def nbytes(self) -> int:
        """Bytes the shard holds: records, slot versions, raw priorities and the sum tree."""
        return self.store.nbytes + self.raw_priority.nbytes + self.tree.tree.nbytes

    @property
    def framed(self) -> dict:
        """The frame-stack fields kept as indices into a frame pool (empty without dedup)."""
        return self.store.framed

    @property
    def versions(self) -> np.ndarray:
        """int64 ``(capacity,)`` version of each slot (see RingStore)."""
        return self.store.versions

    def _p(self, raw: np.ndarray) -> np.ndarray:
        """Tree value ``(raw + eps) ** alpha`` (float64) for raw priorities >= 0."""
        return np.power(np.asarray(raw, dtype=np.float64) + self.eps, self.alpha)

    # -- writing -------------------------------------------------------------
    def add(self, records: Mapping[str, np.ndarray], priorities: np.ndarray) -> np.ndarray:
        """Append n records with raw priorities (|TD|, length n; the absolute
        value is taken); returns the int64 slot ids.

        Same contract as :meth:`RingStore.add`: when n > capacity only the last
        ``len(ids)`` rows (and priorities) are kept.
        """
        priorities = np.asarray(priorities).reshape(-1)
        if len(priorities) != self.store.count_rows(records):
            raise ValueError("priorities must have one value per record")
        return self._prioritize(self.store.add(records), priorities)

    def add_framed(self, records: Mapping[str, np.ndarray], frames: np.ndarray,
                   priorities: np.ndarray) -> np.ndarray:
        """:meth:`add` for records whose frame stacks index ``frames`` (see RingStore.add_framed)."""
        return self._prioritize(self.store.add_framed(records, frames), np.asarray(priorities).reshape(-1))

    def add_indexed(self, records: Mapping[str, np.ndarray], frame_idx: Mapping[str, np.ndarray],
                    priorities: np.ndarray) -> np.ndarray:
        """:meth:`add` for records whose frame stacks the pool holds already (see RingStore.add_indexed)."""
        return self._prioritize(self.store.add_indexed(records, frame_idx), np.asarray(priorities).reshape(-1))

    def _prioritize(self, ids: np.ndarray, priorities: np.ndarray) -> np.ndarray:
        kept = np.ascontiguousarray(priorities[len(priorities) - len(ids):], dtype=np.float32)
        if _insert_priorities(self.tree.tree, self.tree.size, self.raw_priority, ids, kept, self.eps, self.alpha):
            raise ValueError("priorities must be finite (a diverged loss?)")
        return ids

    def replace(self, records: Mapping[str, np.ndarray], priorities: np.ndarray) -> np.ndarray:
        """Clear, then :meth:`add` (the baseline learner's wholesale refresh)."""
        self.clear()
        return self.add(records, priorities)

    def clear(self) -> None:
        """Empty the shard.  Versions keep counting, so stale feedback from
        before the clear is still recognised as stale."""
        self.store.clear()
        self.tree.clear()
        self.raw_priority.fill(0.0)

    # -- sampling ------------------------------------------------------------
    def sample(self, k: int, rng: np.random.Generator,
               out: Mapping[str, np.ndarray] | None = None) -> Sample:
        """Draw k slots, stratified: ``[0, total)`` is cut into k equal
        segments and one uniform draw is made in each (with replacement across
        segments, so a high-priority slot may appear more than once).

        If ``out`` is given (``{name: array (>=k, *shape)}``), the records are
        gathered into its first k rows.  Raises ValueError if the shard is
        empty (or all stored priorities are 0, possible only with eps=0).
        """
        total = self.tree.total
        if self.store.size == 0 or not total > 0.0:
            raise ValueError("cannot sample from an empty replay shard")
        if len(self._arange) < k:
            self._arange = np.arange(k, dtype=np.float64)
        u = rng.random(k)
        u += self._arange[:k]
        u *= total / k
        ids = self.tree.find(u)
        sample = Sample(ids=ids,
                        versions=self.store.versions[ids],
                        probs=self.tree.get(ids) / total,
                        priorities=self.raw_priority[ids])
        if out is not None:
            self.store.gather(ids, out)
        return sample

    def sample_into(self, k: int, rng: np.random.Generator, out: Mapping[str, np.ndarray]) -> Sample:
        """:meth:`sample` ``k`` records straight into a reply message's views.

        ``out`` holds the record fields and ``ids``, ``versions``, ``probs`` and
        ``priority`` arrays of at least k rows (the buffer's sample reply layout);
        all of them are filled. With frames stored once, ``out`` has the frame-stack
        fields as ``<name>_idx`` into ``out["frames"]``, which gets each distinct frame
        of the batch once (``Sample.frames`` says how many).
        """
        s = self.sample(k, rng, out=None if self.framed else out)
        if self.framed:
            s = s._replace(frames=self.store.gather_framed(s.ids, out, out["frames"]))
        out["ids"][:k], out["versions"][:k] = s.ids, s.versions
        out["probs"][:k], out["priority"][:k] = s.probs, s.priorities
        return s

    def update_priorities(self, ids: np.ndarray, versions: np.ndarray,
                          priorities: np.ndarray) -> int:
        """Set new raw priorities for sampled slots; returns the stale count.

        An update is applied only where ``versions[ids] == versions`` (the slot
        still holds the record that was sampled); the rest are dropped and
        counted.  Duplicate ids: the last value wins.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        versions = np.ascontiguousarray(versions, dtype=np.int64).reshape(-1)
        priorities = np.ascontiguousarray(priorities).reshape(-1)
        if not len(ids) == len(versions) == len(priorities):
            raise ValueError("ids, versions and priorities must have equal length")
        args = (self.tree.tree, self.tree.size, self.store.versions, self.raw_priority)
        stale = _apply_feedback(*args, ids, versions, priorities, self.eps, self.alpha)
        if stale == UNSORTED:
            order = np.argsort(ids, kind="stable")  # stable: the last of a repeated id stays last
            stale = _apply_feedback(*args, ids[order], versions[order], priorities[order], self.eps, self.alpha)
        if stale == OUT_OF_RANGE:
            raise IndexError(f"ids outside [0, {self.capacity})")
        if stale == NOT_FINITE:
            raise ValueError("priorities must be finite (a diverged loss?)")
        return stale

    def export(self, out: Mapping[str, np.ndarray],
               priorities_out: np.ndarray | None = None) -> int:
        """Copy all records oldest first into ``out`` (see RingStore.export) and,
        if given, their raw priorities into ``priorities_out[:n]``; returns n."""
        n = self.store.export(out)
        if priorities_out is not None:
            np.take(self.raw_priority, self.store.oldest_first(), out=priorities_out[:n],
                    mode="clip")
        return n


def importance_weights(probs: np.ndarray, n: int, beta: float) -> np.ndarray:
    """Importance-sampling weights ``w_i = (n * P(i)) ** -beta / max_j w_j``.

    ``probs``: float (k,) sampling probabilities of the batch items over the
    WHOLE replay.  With several shards, pass each item's in-shard prob
    multiplied by that shard's share of the batch (k_shard / k), and ``n`` = the
    total number of records over all shards.  (After max-normalization the
    factor n cancels; it is kept so the formula reads as in the paper.)
    Returns float32 (k,), max == 1; ``beta = 0`` gives all ones.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if n < 1:
        raise ValueError("n must be >= 1")
    if probs.size == 0:
        return np.zeros(0, dtype=np.float32)
    w = np.power(n * probs, -float(beta))
    w /= w.max()
    return w.astype(np.float32)


def linear_schedule(start: float, end: float, t: float, duration: float) -> float:
    """Linear interpolation from ``start`` (t <= 0) to ``end`` (t >= duration).

    Used to anneal beta towards 1.  ``duration <= 0`` returns ``end``.
    """
    if duration <= 0:
        return float(end)
    frac = min(max(t / duration, 0.0), 1.0)
    return float(start + frac * (end - start))
