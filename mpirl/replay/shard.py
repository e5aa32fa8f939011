"""A prioritized replay shard (Schaul et al. 2016, as used by Ape-X): a ring of records and a sum tree.

A :class:`PrioritizedShard` is the :class:`~mpirl.replay.memory.ReplayMemory` of a
:class:`~mpirl.replay.ring.RingStore` (FIFO record storage, frames stored once or not) and a
:class:`~mpirl.replay.prioritized.PrioritizedSampler` (``p_i = (|delta_i| + eps) ** alpha`` per slot in a sum
tree; ``P(i) = p_i / sum_j p_j``; priority feedback lands only on a slot that still holds the sampled record).
Also here: the importance weights a learner computes from the sampled probabilities, and beta's schedule.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .memory import ReplayMemory, Sample
from .prioritized import PrioritizedSampler
from .ring import RingStore, Spec

__all__ = ["PrioritizedShard", "Sample", "importance_weights", "linear_schedule"]


class PrioritizedShard(ReplayMemory):
    """Replay memory of ``capacity`` records with proportional prioritization.

    Args:
        spec: record spec ``{name: (shape, dtype)}`` (see ``ring.py``).
        capacity: number of slots.
        alpha: prioritization exponent (0 = uniform).
        eps: added to raw priorities so no stored record has p = 0.
        dedup_frames, stream_frames: frames stored once (see RingStore).

    Attributes:
        store: the RingStore (``store.fields`` holds the records).
        sampler: the PrioritizedSampler; ``tree`` (its SumTree of ``p = (raw + eps) ** alpha``) and
            ``raw_priority`` (float32 ``(capacity,)`` raw priority per slot) are its arrays.
    """

    def __init__(self, spec: Spec, capacity: int, alpha: float, eps: float = 1e-6,
                 dedup_frames: bool = False, stream_frames: int = 0) -> None:
        if alpha < 0 or eps < 0:
            raise ValueError("alpha and eps must be >= 0")
        store = RingStore(spec, capacity, dedup_frames, stream_frames)
        sampler = PrioritizedSampler(store.capacity, alpha, eps, versions=store.versions)
        super().__init__(store, sampler)
        self.alpha, self.eps = sampler.alpha, sampler.eps
        self.tree = sampler.tree


def importance_weights(probs: np.ndarray, n: int, beta: float, smallest: float | None = None) -> np.ndarray:
    """Importance-sampling weights ``w_i = (n * P(i)) ** -beta / max_j w_j``.

    ``probs``: float (k,) sampling probabilities of the batch items over the
    WHOLE replay.  With several shards, pass each item's in-shard prob
    multiplied by that shard's share of the batch (k_shard / k), and ``n`` = the
    total number of records over all shards.  (After max-normalization the
    factor n cancels; it is kept so the formula reads as in the paper.)
    Returns float32 (k,), max == 1; ``beta = 0`` gives all ones. ``smallest``: the smallest probability of a batch
    these ``probs`` are a part of (K data-parallel learners' parts): the weights are normalised by the whole
    batch's largest, so each part's are those of the whole batch.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if n < 1:
        raise ValueError("n must be >= 1")
    if probs.size == 0:
        return np.zeros(0, dtype=np.float32)
    out = np.empty(probs.shape, dtype=np.float32)
    whole = np.nan if smallest is None else float(smallest)
    _weights(np.ascontiguousarray(probs.reshape(-1)), float(n), -float(beta), whole, out.reshape(-1))
    return out


@njit(cache=True, nogil=True)
def _weights(probs, n, power, smallest, out):  # pragma: no cover - compiled
    """``out = (n * probs) ** power / m`` (float32), ``m`` the largest of them, or ``(n * smallest) ** power``
    if ``smallest`` is not NaN: one pass where numpy takes five (a NaN weight makes every weight NaN, as
    numpy's max does)."""
    w = np.empty(probs.size, np.float64)
    top = -np.inf
    for i in range(probs.size):
        w[i] = (n * probs[i]) ** power
        if not w[i] <= top:  # larger, or NaN (which then stays)
            if not top != top:
                top = w[i]
    if smallest == smallest:
        top = (n * smallest) ** power
    for i in range(probs.size):
        out[i] = w[i] / top


def linear_schedule(start: float, end: float, t: float, duration: float) -> float:
    """Linear interpolation from ``start`` (t <= 0) to ``end`` (t >= duration).

    Used to anneal beta towards 1.  ``duration <= 0`` returns ``end``.
    """
    if duration <= 0:
        return float(end)
    frac = min(max(t / duration, 0.0), 1.0)
    return float(start + frac * (end - start))
