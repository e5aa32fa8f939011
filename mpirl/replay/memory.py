"""The replay memory the buffer serves from and a learner keeps locally: a store and a sampler.

A :class:`ReplayMemory` joins a :class:`Store` (the records, one versioned slot each: a
:class:`~mpirl.replay.ring.RingStore` of transitions, frames stored once or not, or an
:class:`~mpirl.replay.episodes.EpisodeStore` of whole episodes) and a :class:`Sampler` (which slots a batch
takes, and the priority or weight each slot carries: :class:`~mpirl.replay.prioritized.PrioritizedSampler`,
:class:`~mpirl.replay.samplers.UniformSampler`, :class:`~mpirl.replay.samplers.AccMERSampler`). The sampler
never sees the records and the store never sees priorities; a slot's version (the store's insertion number)
is what feedback is matched against, so a value sent back for a slot refilled since it was sampled is
dropped.

What the buffer and a learner call (all of it on :class:`ReplayMemory`)::

    ids = memory.add(records, priorities)           # priorities: one per record (ignored by unweighted samplers)
    s = memory.sample_into(k, rng, reply_views)     # the records and ids, versions, probs, priority
    stale = memory.update_priorities(s.ids, s.versions, values)
    memory.size, memory.total, memory.nbytes, memory.framed
    n = memory.export(out)                          # every record, oldest first (with raw_priority: snapshots)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, NamedTuple, Protocol

import numpy as np

from .samplers import Picks

if TYPE_CHECKING:
    from .frame_cache import CacheMirror


class Sample(NamedTuple):
    """One sampled batch of k items (all arrays have shape (k,)).

    ids: int64 slot ids.  versions: int64 slot versions at sampling time (send back with the new
    priorities).  probs: float64 sampling probability of each within this memory.  priorities: float32 each
    slot's raw priority or weight (the sampler's :meth:`Sampler.weights_of`).
    """
    ids: np.ndarray
    versions: np.ndarray
    probs: np.ndarray
    priorities: np.ndarray
    frames: int = 0  # with frames stored once: distinct frames written to the reply (sample_into)


class Store(Protocol):
    """Fixed-capacity FIFO of records, one versioned slot each (slots ``0 .. size - 1`` are filled)."""

    spec: dict
    capacity: int
    size: int
    versions: np.ndarray  # int64 (capacity,): each slot's insertion number, -1 = empty
    framed: dict  # the frame-stack fields kept as indices into a frame pool (empty: stored whole)

    @property
    def nbytes(self) -> int: ...

    def count_rows(self, records: Mapping[str, np.ndarray]) -> int: ...

    def add(self, records: Mapping[str, np.ndarray]) -> np.ndarray: ...

    def gather(self, ids: np.ndarray, out: Mapping[str, np.ndarray]) -> None: ...

    def export(self, out: Mapping[str, np.ndarray]) -> int: ...

    def oldest_first(self) -> np.ndarray: ...

    def clear(self) -> None: ...


class Sampler(Protocol):
    """Which slots a batch takes, and each slot's priority or weight; never the records.

    A sampler may also offer ``sample_scored(b, size, rng) -> (Picks, probs, weights)``: :meth:`sample` with
    :meth:`probs` and :meth:`weights_of` of its picks, read in the same pass (the prioritized one does; a memory
    uses it when there)."""

    distinct: bool  # a batch never repeats a slot (then it refuses size < b)

    @property
    def nbytes(self) -> int: ...

    @property
    def raw_priority(self) -> np.ndarray: ...  # float32 (capacity,): each slot's priority or weight

    def on_insert(self, ids: np.ndarray, versions: np.ndarray, priorities: np.ndarray | None = None) -> None: ...

    def sample(self, b: int, size: int, rng: np.random.Generator) -> Picks: ...

    def probs(self, ids: np.ndarray, size: int) -> np.ndarray: ...

    def weights_of(self, ids: np.ndarray) -> np.ndarray: ...

    def update(self, ids: np.ndarray, versions: np.ndarray, values: np.ndarray) -> int: ...

    def total(self, size: int) -> float: ...

    def clear(self) -> None: ...


class ReplayMemory:
    """A store's records sampled by a sampler (module docstring).

    With a sampler that hands out a reuse block (AccMER), :meth:`sample_into` copies the block from a cache
    gathered once per window; :meth:`sample_batch` (a learner's own batch arrays) leaves it in place.
    """

    def __init__(self, store: Store, sampler: Sampler) -> None:
        self.store = store
        self.sampler = sampler
        self.framed = store.framed
        self.cache: dict[str, np.ndarray] | None = None  # the reuse block, gathered once per window

    # -- sizes -------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.store.capacity

    @property
    def size(self) -> int:
        """Number of filled slots."""
        return self.store.size

    @property
    def total(self) -> float:
        """The sampler's total over the filled slots (sum of ``p^alpha``, of weights, or the count)."""
        return self.sampler.total(self.store.size)

    @property
    def nbytes(self) -> int:
        """Bytes held: the store's, the sampler's and the reuse cache."""
        cache = sum(a.nbytes for a in self.cache.values()) if self.cache else 0
        return self.store.nbytes + self.sampler.nbytes + cache

    @property
    def versions(self) -> np.ndarray:
        """int64 ``(capacity,)`` each slot's version (the store's insertion number; -1 = empty)."""
        return self.store.versions

    @property
    def raw_priority(self) -> np.ndarray:
        """float32 ``(capacity,)`` each slot's raw priority or weight (what replay snapshots keep)."""
        return self.sampler.raw_priority

    # -- writing -----------------------------------------------------------------
    def add(self, records: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> np.ndarray:
        """Append n records with raw priorities (length n; the absolute value is taken); returns the int64
        slot ids. As :meth:`RingStore.add`: when n > capacity only the last ``len(ids)`` rows are kept."""
        if priorities is not None:
            priorities = np.asarray(priorities).reshape(-1)
            if len(priorities) != self.store.count_rows(records):
                raise ValueError("priorities must have one value per record")
        return self._inserted(self.store.add(records), priorities)

    def add_framed(self, records: Mapping[str, np.ndarray], frames: np.ndarray,
                   priorities: np.ndarray | None = None) -> np.ndarray:
        """:meth:`add` for records whose frame stacks index ``frames`` (see RingStore.add_framed)."""
        return self._inserted(self.store.add_framed(records, frames), priorities)  # type: ignore[attr-defined]

    def add_indexed(self, records: Mapping[str, np.ndarray], frame_idx: Mapping[str, np.ndarray],
                    priorities: np.ndarray | None = None) -> np.ndarray:
        """:meth:`add` for records whose frame stacks the pool holds already (see RingStore.add_indexed)."""
        return self._inserted(self.store.add_indexed(records, frame_idx), priorities)  # type: ignore[attr-defined]

    def _inserted(self, ids: np.ndarray, priorities: np.ndarray | None) -> np.ndarray:
        if priorities is not None:
            priorities = np.asarray(priorities).reshape(-1)
            priorities = priorities[len(priorities) - len(ids):]
        self.sampler.on_insert(ids, self.store.versions[ids], priorities)
        return ids

    def replace(self, records: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> np.ndarray:
        """Clear, then :meth:`add` (the baseline learner's wholesale refresh)."""
        self.clear()
        return self.add(records, priorities)

    def clear(self) -> None:
        """Empty the memory. Versions keep counting, so stale feedback from before is still recognised."""
        self.store.clear()
        self.sampler.clear()

    # -- sampling ----------------------------------------------------------------
    def pick(self, k: int, rng: np.random.Generator) -> Picks:
        """The sampler's ``k`` slots; a sampler of distinct slots holding fewer than ``k`` (only when a job
        stops before the memory holds a batch) gets ``k`` uniform draws with replacement instead."""
        size = self.store.size
        if k > size and self.sampler.distinct:
            ids = rng.integers(0, size, k)
            return Picks(ids, self.store.versions[ids])
        return self.sampler.sample(k, size, rng)

    def _sample(self, picks: Picks, frames: int = 0) -> Sample:
        ids = picks.ids
        return Sample(ids, picks.versions, self.sampler.probs(ids, self.store.size), self.sampler.weights_of(ids),
                      frames)

    def _pick_scored(self, k: int, rng: np.random.Generator) -> tuple[Picks, Sample]:
        """:meth:`pick` and its :class:`Sample`; from a sampler that reads the probs and weights as it draws
        (``sample_scored``, the prioritized one) in that one pass."""
        scored = getattr(self.sampler, "sample_scored", None)
        if scored is None or (k > self.store.size and self.sampler.distinct):
            picks = self.pick(k, rng)
            return picks, self._sample(picks)
        picks, probs, priorities = scored(k, self.store.size, rng)
        return picks, Sample(picks.ids, picks.versions, probs, priorities)

    def sample(self, k: int, rng: np.random.Generator, out: Mapping[str, np.ndarray] | None = None) -> Sample:
        """Draw ``k`` slots; if ``out`` is given (``{name: array (>=k, *shape)}``), gather the records into its
        first k rows. Raises ValueError if nothing can be sampled."""
        picks, s = self._pick_scored(k, rng)
        if out is not None:
            self._gather(picks, out)
        return s

    def sample_into(self, k: int, rng: np.random.Generator, out: Mapping[str, np.ndarray],
                    mirror: CacheMirror | None = None) -> Sample:
        """:meth:`sample` ``k`` records straight into a reply message's views.

        ``out`` holds the record fields and ``ids``, ``versions``, ``probs`` and ``priority`` arrays of at least
        k rows (the buffer's sample reply layout); all of them are filled. With frames stored once, ``out`` has
        the frame-stack fields as ``<name>_idx`` into ``out["frames"]``, which gets each distinct frame of the
        batch once (``Sample.frames`` says how many); with the learner's frame cache (``mirror``) only those it does
        not hold (:mod:`mpirl.replay.frame_cache`). A reuse block is copied from the cache.
        """
        picks, s = self._pick_scored(k, rng)
        if self.framed:
            frames = self.store.gather_framed(picks.ids, out, out["frames"], mirror)  # type: ignore[attr-defined]
            s = s._replace(frames=frames)
        else:
            self._gather(picks, out)
        out["ids"][:k], out["versions"][:k] = s.ids, s.versions
        out["probs"][:k], out["priority"][:k] = s.probs, s.priorities
        return s

    def _gather(self, picks: Picks, out: Mapping[str, np.ndarray]) -> None:
        r = picks.reuse
        if not r:
            self.store.gather(picks.ids, out)
            return
        spec = self.store.spec
        if picks.fresh or self.cache is None:
            if self.cache is None:
                self.cache = {name: np.zeros((r, *shape), dtype) for name, (shape, dtype) in spec.items()}
            self.store.gather(picks.ids[:r], self.cache)
        for name in spec:
            out[name][:r] = self.cache[name]
        k = len(picks.ids)
        if k > r:
            self.store.gather(picks.ids[r:], {name: out[name][r:k] for name in spec})

    def sample_batch(self, k: int, rng: np.random.Generator, batch: Mapping[str, np.ndarray]) -> Picks:
        """Sample ``k`` slots into a learner's own ``batch`` arrays, kept between steps: a reuse block is
        gathered only when the sampler chose a new one and otherwise stays in place."""
        picks = self.pick(k, rng)
        r = picks.reuse
        if r and picks.fresh:
            self.store.gather(picks.ids[:r], batch)
        if len(picks.ids) > r:
            self.store.gather(picks.ids[r:], {name: a[r:] for name, a in batch.items()})
        return picks

    def update_priorities(self, ids: np.ndarray, versions: np.ndarray, values: np.ndarray) -> int:
        """The sampled slots' new priorities or weights (dropped where the slot was refilled since it was
        sampled); returns how many were dropped."""
        return self.sampler.update(ids, versions, values)

    # -- reading everything -----------------------------------------------------------
    def export(self, out: Mapping[str, np.ndarray], priorities_out: np.ndarray | None = None) -> int:
        """Copy all records oldest first into ``out`` (see RingStore.export) and, if given, their raw
        priorities into ``priorities_out[:n]``; returns n."""
        n = self.store.export(out)
        if priorities_out is not None:
            np.take(self.sampler.raw_priority, self.store.oldest_first(), out=priorities_out[:n], mode="clip")
        return n
