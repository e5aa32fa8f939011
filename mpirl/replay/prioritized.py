"""Proportional prioritization (Schaul et al. 2016, as used by Ape-X): a sampler over a memory's slots.

A :class:`PrioritizedSampler` keeps, per slot, the raw priority (``|TD|``) and in a
:class:`~mpirl.replay.sumtree.SumTree` ``p_i = (|delta_i| + eps) ** alpha``; slot i is drawn with
probability ``P(i) = p_i / sum_j p_j``. Priority feedback is versioned: an update only lands on a slot that
still holds the record that was sampled (the slot versions are the store's, shared, not copied).
It implements :class:`~mpirl.replay.memory.Sampler`; the records live in the store.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .samplers import Picks
from .sumtree import SumTree, _clip, _descend, _update_sorted

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


@njit(cache=True, nogil=True)
def _draw_stratified(tree, size, r, scale, total, slot_versions, raw_priority,
                     ids, versions, probs, priorities):  # pragma: no cover - compiled
    """A batch of stratified draws in one call: draw i is ``u = (r[i] + i) * scale`` (as numpy computes
    ``(r + arange(b)) * scale``), its slot the leaf whose prefix interval holds u (SumTree.find's descent), and
    per slot its version, ``P = leaf / total`` and its raw priority."""
    hi = np.nextafter(total, 0.0)
    x = np.empty(r.size, np.float64)
    for i in range(r.size):
        x[i] = _clip((r[i] + np.float64(i)) * scale, hi)
    _descend(tree, size, x, ids)
    for i in range(r.size):
        node = ids[i]
        slot = node - size
        ids[i] = slot
        versions[i] = slot_versions[slot]
        probs[i] = tree[node] / total
        priorities[i] = raw_priority[slot]


class PrioritizedSampler:
    """Stratified proportional sampling over ``capacity`` slots (module docstring).

    Args:
        capacity: number of slots.
        alpha: prioritization exponent (0 = uniform).
        eps: added to raw priorities so no stored record has p = 0.
        versions: the store's int64 ``(capacity,)`` slot versions (shared; a private array if omitted, kept
            by :meth:`on_insert`).

    Attributes:
        tree: the SumTree of ``p = (raw + eps) ** alpha``.
        raw_priority: float32 ``(capacity,)`` raw priority per slot.
    """

    distinct = False  # a batch may repeat a slot (draws with replacement across segments)

    def __init__(self, capacity: int, alpha: float, eps: float = 1e-6, versions: np.ndarray | None = None) -> None:
        if alpha < 0 or eps < 0:
            raise ValueError("alpha and eps must be >= 0")
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.tree = SumTree(capacity)
        self.capacity = self.tree.capacity
        self.raw_priority = np.zeros(self.capacity, dtype=np.float32)
        self._shared = versions is not None
        self.versions = versions if versions is not None else np.full(self.capacity, -1, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        """Bytes of the raw priorities and the sum tree (and the versions, unless the store's)."""
        return self.raw_priority.nbytes + self.tree.tree.nbytes + (0 if self._shared else self.versions.nbytes)

    def total(self, size: int) -> float:
        """Sum of ``p^alpha`` over the filled slots."""
        return self.tree.total

    def on_insert(self, ids: np.ndarray, versions: np.ndarray, priorities: np.ndarray | None = None) -> None:
        """Slots ``ids`` (one ascending run, or two where the ring wrapped) were written with records of raw
        priorities ``priorities`` (the absolute value is taken; one per id)."""
        if priorities is None:
            raise ValueError("a prioritized memory needs a priority per record")
        kept = np.ascontiguousarray(priorities, dtype=np.float32)
        if _insert_priorities(self.tree.tree, self.tree.size, self.raw_priority, ids, kept, self.eps, self.alpha):
            raise ValueError("priorities must be finite (a diverged loss?)")
        if not self._shared:
            self.versions[ids] = versions

    def sample(self, b: int, size: int, rng: np.random.Generator) -> Picks:
        """Draw b slots, stratified: ``[0, total)`` is cut into b equal segments and one uniform draw is made
        in each (with replacement across segments, so a high-priority slot may appear more than once).
        Raises ValueError if nothing is stored (or all stored priorities are 0, possible only with eps=0)."""
        return self.sample_scored(b, size, rng)[0]

    def sample_scored(self, b: int, size: int, rng: np.random.Generator) -> tuple[Picks, np.ndarray, np.ndarray]:
        """:meth:`sample`, with the picks' :meth:`probs` (float64) and :meth:`weights_of` (float32) read in the
        same compiled pass as the tree descent."""
        total = self.tree.total
        if size == 0 or not total > 0.0:
            raise ValueError("cannot sample from an empty replay shard")
        ids, versions = np.empty(b, np.int64), np.empty(b, np.int64)
        probs, priorities = np.empty(b, np.float64), np.empty(b, np.float32)
        _draw_stratified(self.tree.tree, self.tree.size, rng.random(b), total / b, total, self.versions,
                         self.raw_priority, ids, versions, probs, priorities)
        return Picks(ids, versions), probs, priorities

    def probs(self, ids: np.ndarray, size: int) -> np.ndarray:
        """float64 ``P(i) = p_i / total`` of slots ``ids``."""
        return self.tree.get(ids) / self.tree.total

    def weights_of(self, ids: np.ndarray) -> np.ndarray:
        """float32 raw priorities of slots ``ids`` (what a learner reads with a batch)."""
        return self.raw_priority[ids]

    def update(self, ids: np.ndarray, versions: np.ndarray, priorities: np.ndarray) -> int:
        """Set new raw priorities for sampled slots; returns the stale count.

        An update is applied only where ``versions[ids] == versions`` (the slot still holds the record that
        was sampled); the rest are dropped and counted. Duplicate ids: the last value wins.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        versions = np.ascontiguousarray(versions, dtype=np.int64).reshape(-1)
        priorities = np.ascontiguousarray(priorities).reshape(-1)
        if not len(ids) == len(versions) == len(priorities):
            raise ValueError("ids, versions and priorities must have equal length")
        args = (self.tree.tree, self.tree.size, self.versions, self.raw_priority)
        stale = _apply_feedback(*args, ids, versions, priorities, self.eps, self.alpha)
        if stale == UNSORTED:
            order = np.argsort(ids, kind="stable")  # stable: the last of a repeated id stays last
            stale = _apply_feedback(*args, ids[order], versions[order], priorities[order], self.eps, self.alpha)
        if stale == OUT_OF_RANGE:
            raise IndexError(f"ids outside [0, {self.capacity})")
        if stale == NOT_FINITE:
            raise ValueError("priorities must be finite (a diverged loss?)")
        return stale

    def clear(self) -> None:
        """Forget every priority (the store's clear resets the versions it shares)."""
        self.tree.clear()
        self.raw_priority.fill(0.0)
        if not self._shared:
            self.versions.fill(-1)
