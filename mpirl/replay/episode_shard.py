"""An episode replay shard: an :class:`EpisodeStore` and a sampler behind the interface the buffer loop serves.

The buffer and learner loops talk to a replay memory through ``add(records, priorities)``,
``sample_into(k, rng, out) -> Sample``, ``update_priorities(ids, versions, values) -> stale``
and ``size``/``total``/``nbytes`` (what :class:`~mpirl.replay.shard.PrioritizedShard` offers). Here a
record is a whole episode, the "priority" an actor sends is ignored (a new episode starts at the
sampler's initial weight), and the values the learner sends back are the episodes' new weights
(AccMER: their mean MAC-PO weight; the uniform sampler ignores them).

With AccMER the reuse set is gathered once per window into a contiguous cache, and every batch of
the window copies that block (one streaming copy) instead of gathering scattered slots again; the
uniform part is gathered per batch. On the learner (the baseline placement) :meth:`sample_batch`
gathers into the learner's own batch arrays, where the reuse block simply stays in place.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from .episodes import EpisodeStore
from .samplers import AccMERSampler, Picks, UniformSampler
from .shard import Sample


class EpisodeShard:
    """Replay of ``capacity`` whole episodes with a ``"uniform"`` or ``"accmer"`` sampler of batches of ``batch``."""

    framed: dict = {}  # episodes are stored whole (no frame sharing)

    def __init__(self, spec: Mapping, capacity: int, sampler: str, batch: int, alpha: float = 0.5,
                 discount: float = 0.8):
        self.episodes = EpisodeStore(spec, capacity)
        self.store = self.episodes.store  # the RingStore (for replay snapshots)
        self.batch = int(batch)
        if sampler == "accmer":
            self.sampler = AccMERSampler(capacity, self.batch, alpha, discount)
        elif sampler == "uniform":
            self.sampler = UniformSampler(capacity)
        else:
            raise ValueError(f"sampler must be 'uniform' or 'accmer', got {sampler!r}")
        self.cache: dict[str, np.ndarray] | None = None  # AccMER's reuse block, gathered once per window

    @property
    def capacity(self) -> int:
        return self.episodes.capacity

    @property
    def size(self) -> int:
        return self.episodes.size

    @property
    def total(self) -> float:
        """Sum of the filled slots' weights (AccMER), or their count (uniform)."""
        w = getattr(self.sampler, "weights", None)
        return float(w[:self.size].sum()) if w is not None else float(self.size)

    @property
    def raw_priority(self) -> np.ndarray:
        """Each slot's weight (float32; ones for uniform sampling): what replay snapshots keep."""
        w = getattr(self.sampler, "weights", None)
        return (w if w is not None else np.ones(self.capacity)).astype(np.float32)

    @property
    def nbytes(self) -> int:
        return self.episodes.nbytes + (sum(a.nbytes for a in self.cache.values()) if self.cache else 0)

    def add(self, records: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> np.ndarray:
        """Insert whole episodes; each starts at the sampler's initial weight (``priorities`` are not used)."""
        ids = self.episodes.add(records)
        self.sampler.on_insert(ids, self.episodes.versions[ids])
        return ids

    def clear(self) -> None:
        self.episodes.clear()
        self.sampler.clear()

    def pick(self, k: int, rng: np.random.Generator) -> Picks:
        return self.sampler.sample(k, self.size, rng)

    def _weights_of(self, ids: np.ndarray) -> np.ndarray:
        w = getattr(self.sampler, "weights", None)
        return (w[ids] if w is not None else np.ones(len(ids))).astype(np.float32)

    def sample_into(self, k: int, rng: np.random.Generator, out: Mapping[str, np.ndarray]) -> Sample:
        """Sample ``k`` episodes into ``out`` (a reply's views: the spec's fields and ids, versions, probs,
        priority); the reuse block is copied from the cache, gathered only when the window opens."""
        fields = {name: out[name] for name in self.episodes.spec}
        if k > self.size:  # only when the job stops before the memory holds a batch: any episodes will do
            ids = rng.integers(0, self.size, k)
            self.episodes.gather(ids, fields)
            versions, probs, prio = self.episodes.versions[ids], np.full(k, 1.0 / self.size), self._weights_of(ids)
            out["ids"][:k], out["versions"][:k], out["probs"][:k], out["priority"][:k] = ids, versions, probs, prio
            return Sample(ids, versions, probs, prio)
        picks = self.pick(k, rng)
        r = picks.reuse
        if r:
            if picks.fresh or self.cache is None:
                if self.cache is None:
                    self.cache = {name: np.zeros((r, *shape), dtype)
                                  for name, (shape, dtype) in self.episodes.spec.items()}
                self.episodes.gather(picks.ids[:r], self.cache)
            for name, arr in fields.items():
                arr[:r] = self.cache[name]
        if k > r:
            self.episodes.gather(picks.ids[r:], {name: arr[r:k] for name, arr in fields.items()})
        probs = np.full(k, 1.0 / self.size)
        prio = self._weights_of(picks.ids)
        out["ids"][:k], out["versions"][:k], out["probs"][:k], out["priority"][:k] = (
            picks.ids, picks.versions, probs, prio)
        return Sample(picks.ids, picks.versions, probs, prio)

    def sample_batch(self, k: int, rng: np.random.Generator, batch: Mapping[str, np.ndarray]) -> Picks:
        """Sample ``k`` episodes into a learner's own ``batch`` arrays (the reuse block stays in place)."""
        picks = self.pick(k, rng)
        self.episodes.gather_picks(picks, batch)
        return picks

    def update_priorities(self, ids: np.ndarray, versions: np.ndarray, values: np.ndarray) -> int:
        """The sampled episodes' new weights (dropped for refilled slots); then the table decays. Returns how
        many were dropped."""
        return self.sampler.update(ids, versions, np.asarray(values, dtype=np.float64))

    def export(self, out: Mapping[str, np.ndarray]) -> int:
        return self.episodes.export(out)
