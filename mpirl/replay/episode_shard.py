"""An episode replay shard: the :class:`~mpirl.replay.memory.ReplayMemory` of an :class:`EpisodeStore` and a
uniform or AccMER sampler.

A record is a whole episode, the "priority" an actor sends is ignored (a new episode starts at the sampler's
initial weight), and the values the learner sends back are the episodes' new weights (AccMER: their mean MAC-PO
weight; the uniform sampler ignores them).

With AccMER the reuse set is gathered once per window into a contiguous cache, and every batch of the window
copies that block (one streaming copy) instead of gathering scattered slots again; the uniform part is gathered
per batch. On the learner (the baseline placement) :meth:`~ReplayMemory.sample_batch` gathers into the
learner's own batch arrays, where the reuse block simply stays in place.
"""

from __future__ import annotations

from typing import Mapping

from .episodes import EpisodeStore
from .memory import ReplayMemory, Sampler
from .samplers import AccMERSampler, UniformSampler


class EpisodeShard(ReplayMemory):
    """Replay of ``capacity`` whole episodes with a ``"uniform"`` or ``"accmer"`` sampler of batches of ``batch``.

    ``episodes`` is the store (an :class:`EpisodeStore`, e.g. for ``batch_arrays``)."""

    def __init__(self, spec: Mapping, capacity: int, sampler: str, batch: int, alpha: float = 0.5,
                 discount: float = 0.8):
        self.batch = int(batch)
        chosen: Sampler
        if sampler == "accmer":
            chosen = AccMERSampler(capacity, self.batch, alpha, discount)
        elif sampler == "uniform":
            chosen = UniformSampler(capacity)
        else:
            raise ValueError(f"sampler must be 'uniform' or 'accmer', got {sampler!r}")
        self.episodes = EpisodeStore(spec, capacity)
        super().__init__(self.episodes, chosen)
