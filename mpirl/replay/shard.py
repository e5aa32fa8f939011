"""A prioritized replay shard (Schaul et al. 2016, as used by Ape-X): a ring of records and a sum tree.

A :class:`PrioritizedShard` is the :class:`~mpirl.replay.memory.ReplayMemory` of a
:class:`~mpirl.replay.ring.RingStore` (FIFO record storage, frames stored once or not) and a
:class:`~mpirl.replay.prioritized.PrioritizedSampler` (``p_i = (|delta_i| + eps) ** alpha`` per slot in a sum
tree; ``P(i) = p_i / sum_j p_j``; priority feedback lands only on a slot that still holds the sampled record).
The importance weights a learner computes from the sampled probabilities: :mod:`mpirl.replay.weights`.
"""
from __future__ import annotations

from .memory import ReplayMemory, Sample
from .prioritized import PrioritizedSampler
from .ring import RingStore, Spec

__all__ = ["PrioritizedShard", "Sample"]


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
