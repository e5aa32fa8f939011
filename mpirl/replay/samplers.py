"""Which episode slots a learner trains on: samplers over a store's slots, never its data.

Storage and sampling are two pieces joined by a small protocol (the idea of
Dopamine's ``replay_memory/samplers.py``): a sampler keeps, per slot, the version
of the episode in it and (if it weighs them) a weight; the store
(:class:`~mpirl.replay.episodes.EpisodeStore`) keeps the episodes. One learner step::

    ids = store.add(episodes)                       # whenever episodes arrive
    sampler.on_insert(ids, store.versions[ids])

    picks = sampler.sample(b, store.size, rng)      # every train step
    store.gather_picks(picks, batch)                # batch: store.batch_arrays(b), kept
    weights = train(batch)                          # e.g. MAC-PO's per-episode weights
    sampler.update(picks.ids, picks.versions, weights)

Both implement :class:`~mpirl.replay.memory.Sampler` (as the prioritized sampler of
``prioritized.py`` does): ``on_insert(ids, versions)``, ``sample(b, size, rng) -> Picks``,
``update(ids, versions, weights) -> stale count``, and what a memory reports of its slots
(``probs``, ``weights_of``, ``total``, ``raw_priority``). Slots ``0 .. size - 1``
are the filled ones (a RingStore fills from slot 0 upward). A batch never repeats a
slot; both samplers refuse ``size < b`` (ValueError): the learner only samples once
``size >= learning_starts >= b``.

:class:`Picks` rows ``0 .. reuse - 1`` are the *reuse set* and ``reuse .. b - 1`` the
fresh uniform picks. ``fresh`` says the reuse set changed at this step, so the caller
gathers those episodes once into the leading rows of its batch arrays (a cached,
contiguous block); on the other steps of the window it keeps that block and gathers
only the uniform rows. :class:`UniformSampler` has ``reuse == 0``.

AccMER (cache-locality-aware multi-agent experience replay, after its Algorithm 1)
==================================================================================

:class:`AccMERSampler` keeps a weight table with one entry per episode slot. Every
``W = max(1, floor(d / b))`` train steps (``d`` = filled slots when the window
opens) it takes the ``r = round(alpha * b)`` highest-weight filled slots as the reuse
set (``numpy.argpartition``, O(d), no full sort) and hands them out at each of the W
steps; each step adds ``b - r`` slots drawn uniformly, without replacement, from the
other filled slots (disjoint from the reuse set). After each step
:meth:`AccMERSampler.update` writes the sampled slots' new weights (a write to a slot
whose version changed since it was sampled is dropped) and then multiplies the whole
table by ``discount``; a refilled slot starts again at ``initial_weight``
(:meth:`~AccMERSampler.on_insert`). ``round`` is half-up. ``alpha = 0``: pure uniform,
``fresh`` is never set; ``alpha = 1``: the whole batch is the reuse set.

Ties (e.g. every slot still at ``initial_weight``) are broken by ``argpartition``'s
order, not at random. A reuse-set member refilled during its window stays in the set
until the window ends: its rows in the caller's cached block still hold the episode
sampled at the window's start (a valid episode to train on), :attr:`Picks.versions`
still carries that episode's version, so its weight write is dropped by the version
guard and the new episode keeps ``initial_weight``; the slot is not drawn by the
uniform part either until the window ends.

Where this follows Algorithm 1 rather than the released code. The code published
with AccMER (on top of MAC-PO's pymarl) differs from the paper's Algorithm 1: it
writes a single batch-mean weight at a ring pointer instead of one weight per
sampled episode, re-sorts the whole table at every step instead of choosing the
reuse set once per window, lets the reuse part and the uniform part overlap (an
episode can appear twice in a batch) and fixes the reuse ratio. (We could not
retrieve that code to re-check; these are the differences as reported to us.) We
implement the algorithm as the paper states it because (1) the window is where the
locality comes from: a reuse set fixed for W steps is gathered once per window, a set
re-chosen every step must be gathered every step; (2) a weight per episode, guarded
by the slot's version, is what a per-episode priority means; a mean written at a ring
pointer credits whatever slot the pointer is at; (3) duplicates within a batch
over-weight an episode in the loss for no stated reason; (4) ``alpha`` is a parameter
so that ``alpha = 0`` reproduces uniform sampling for ablations.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

_RENORM = 1e-100  # the lazy decay scale is folded into the table below this


class Picks(NamedTuple):
    """One batch of b slots.

    ids: int64 (b,) distinct slot ids; rows ``0 .. reuse-1`` the reuse set, the rest uniform.
    versions: int64 (b,) the versions to send back with the sampler's ``update`` (for the
        reuse set: the versions when the set was chosen, i.e. of the cached episodes).
    fresh: the reuse set was (re)chosen at this step: gather ``ids[:reuse]`` again.
    reuse: number of leading reuse rows (0 for uniform sampling).
    """
    ids: np.ndarray
    versions: np.ndarray
    fresh: bool = False
    reuse: int = 0


def _check_sample(b: int, size: int, capacity: int) -> None:
    if b < 1:
        raise ValueError(f"batch size must be >= 1, got {b}")
    if size > capacity:
        raise ValueError(f"size {size} exceeds the sampler's capacity {capacity}")
    if size < b:
        raise ValueError(f"cannot sample {b} distinct episodes from {size} (sample once size >= batch)")


class UniformSampler:
    """b distinct filled slots, each b-subset equally likely (pymarl's uniform episode sampling).

    Args:
        capacity: the store's number of slots.
    """

    distinct = True

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.versions = np.full(self.capacity, -1, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return self.versions.nbytes

    @property
    def raw_priority(self) -> np.ndarray:
        """Ones (float32, ``(capacity,)``): every slot weighs the same."""
        return np.ones(self.capacity, dtype=np.float32)

    def total(self, size: int) -> float:
        """The number of filled slots."""
        return float(size)

    def probs(self, ids: np.ndarray, size: int) -> np.ndarray:
        """float64 ``1 / size`` for each of ``ids``."""
        return np.full(len(ids), 1.0 / size)

    def weights_of(self, ids: np.ndarray) -> np.ndarray:
        """Ones (float32), one per id."""
        return np.ones(len(ids), dtype=np.float32)

    def on_insert(self, ids: np.ndarray, versions: np.ndarray, priorities: np.ndarray | None = None) -> None:
        """Slots ``ids`` now hold records of ``versions`` (``priorities`` are not used)."""
        self.versions[np.asarray(ids, dtype=np.int64)] = versions

    def sample(self, b: int, size: int, rng: np.random.Generator) -> Picks:
        _check_sample(b, size, self.capacity)
        ids = rng.choice(size, b, replace=False)
        return Picks(ids, self.versions[ids])

    def update(self, ids: np.ndarray, versions: np.ndarray, weights: np.ndarray | None = None) -> int:
        """No weights to keep: a no-op (returns 0)."""
        return 0

    def clear(self) -> None:
        self.versions.fill(-1)


class AccMERSampler:
    """AccMER's reuse-set + uniform batches over a decaying weight table (module docstring).

    Args:
        capacity: the store's number of slots.
        batch: b, the batch size :meth:`sample` is called with (fixes ``reuse``).
        alpha: reuse ratio in [0, 1]; ``reuse = round(alpha * b)`` (half-up).
        discount: the factor the whole table is multiplied by after each step, in (0, 1].
        initial_weight: the weight of a newly written slot.

    The decay is lazy: the table stores ``weight / scale`` and each step multiplies
    only ``scale`` (O(1) instead of O(capacity)); :attr:`weights` gives the real values.
    """

    def __init__(self, capacity: int, batch: int, alpha: float = 0.5, discount: float = 0.8,
                 initial_weight: float = 1.0) -> None:
        if capacity < 1 or batch < 1:
            raise ValueError(f"capacity and batch must be >= 1, got {capacity}, {batch}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount must be in (0, 1], got {discount}")
        if not np.isfinite(initial_weight):
            raise ValueError(f"initial_weight must be finite, got {initial_weight}")
        self.capacity, self.batch = int(capacity), int(batch)
        self.alpha, self.discount, self.initial_weight = float(alpha), float(discount), float(initial_weight)
        self.reuse = int(np.floor(self.alpha * self.batch + 0.5))
        self.versions = np.full(self.capacity, -1, dtype=np.int64)
        self._table = np.zeros(self.capacity, dtype=np.float64)  # weight / scale
        self._scale = 1.0
        self.window = 0  # W of the current window
        self.steps_left = 0  # steps of the current window still to hand out
        self.reuse_ids = np.zeros(0, dtype=np.int64)  # the reuse set, sorted
        self.reuse_versions = np.zeros(0, dtype=np.int64)  # their versions when chosen
        self._shifted = np.zeros(0, dtype=np.int64)  # reuse_ids - arange(r): maps to the complement
        self._d = 0  # filled slots when the window opened

    distinct = True

    # -- the table -------------------------------------------------------------
    @property
    def weights(self) -> np.ndarray:
        """float64 ``(capacity,)`` current weight of every slot (a copy)."""
        return self._table * self._scale

    @property
    def raw_priority(self) -> np.ndarray:
        """float32 ``(capacity,)`` current weight of every slot (a copy; what replay snapshots keep)."""
        return self.weights.astype(np.float32)

    @property
    def nbytes(self) -> int:
        return self.versions.nbytes + self._table.nbytes

    def total(self, size: int) -> float:
        """Sum of the filled slots' weights."""
        return float(self.weights[:size].sum())

    def probs(self, ids: np.ndarray, size: int) -> np.ndarray:
        """float64 ``1 / size`` for each of ``ids`` (the uniform part's probability; the reuse set is chosen)."""
        return np.full(len(ids), 1.0 / size)

    def weights_of(self, ids: np.ndarray) -> np.ndarray:
        """float32 current weights of slots ``ids`` (what a learner trains the batch with)."""
        return (self._table[ids] * self._scale).astype(np.float32)

    def on_insert(self, ids: np.ndarray, versions: np.ndarray, priorities: np.ndarray | None = None) -> None:
        """Slots ``ids`` were (re)filled with episodes of ``versions``: back to ``initial_weight`` (``priorities``
        are not used)."""
        ids = np.asarray(ids, dtype=np.int64)
        self.versions[ids] = versions
        self._table[ids] = self.initial_weight / self._scale

    def update(self, ids: np.ndarray, versions: np.ndarray, weights: np.ndarray | None = None) -> int:
        """Write the sampled slots' new weights, then decay the whole table; returns the stale count.

        A write lands only where the slot still holds the sampled version (``versions``
        as :meth:`sample` returned them); the rest are dropped and counted. Duplicate
        ids: the last value wins. ``weights=None`` only decays (a step without weights).
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        versions = np.asarray(versions, dtype=np.int64).reshape(-1)
        stale = 0
        if weights is not None:
            weights = np.asarray(weights, dtype=np.float64).reshape(-1)
            if not len(ids) == len(versions) == len(weights):
                raise ValueError("ids, versions and weights must have equal length")
            if len(ids) and (ids.min() < 0 or ids.max() >= self.capacity):
                raise IndexError(f"ids outside [0, {self.capacity})")
            if not np.isfinite(weights).all():
                raise ValueError("weights must be finite (a diverged loss?)")
            live = (versions >= 0) & (self.versions[ids] == versions)
            stale = int(len(ids) - np.count_nonzero(live))
            self._table[ids[live]] = weights[live] / self._scale
        self._scale *= self.discount
        if self._scale < _RENORM:
            self._table *= self._scale
            self._scale = 1.0
        return stale

    # -- sampling --------------------------------------------------------------
    def sample(self, b: int, size: int, rng: np.random.Generator) -> Picks:
        """The next batch: the window's reuse set (``fresh`` when it was just chosen)
        followed by ``b - reuse`` distinct uniform picks from the other filled slots."""
        if b != self.batch:
            raise ValueError(f"this sampler was built for batches of {self.batch}, asked for {b}")
        _check_sample(b, size, self.capacity)
        r = self.reuse
        fresh = False
        if r and (self.steps_left == 0 or size < self._d):  # size < d only after a clear
            self._choose(size)
            fresh = True
        elif not r and self.steps_left == 0:
            self.window, self.steps_left, self._d = max(1, size // b), max(1, size // b), size
        self.steps_left -= 1
        ids = np.empty(b, dtype=np.int64)
        versions = np.empty(b, dtype=np.int64)
        ids[:r], versions[:r] = self.reuse_ids, self.reuse_versions
        if b > r:
            # distinct values in [0, size - r), mapped onto the slots outside the reuse set
            u = rng.choice(size - r, b - r, replace=False)
            if r:
                u += np.searchsorted(self._shifted, u, side="right")
            ids[r:] = u
            versions[r:] = self.versions[u]
        return Picks(ids, versions, fresh, r)

    def _choose(self, size: int) -> None:
        r = self.reuse
        table = self._table[:size]
        top = np.argpartition(table, size - r)[size - r:] if r < size else np.arange(size)
        top.sort()
        self.reuse_ids = top.astype(np.int64)
        self.reuse_versions = self.versions[self.reuse_ids]
        self._shifted = self.reuse_ids - np.arange(r, dtype=np.int64)
        self._d = size
        self.window = self.steps_left = max(1, size // self.batch)

    def clear(self) -> None:
        """Forget every slot and the current window (after the store's ``clear``)."""
        self.versions.fill(-1)
        self._table.fill(0.0)
        self._scale = 1.0
        self.window = self.steps_left = self._d = 0
        self.reuse_ids = self.reuse_versions = self._shifted = np.zeros(0, dtype=np.int64)
