"""A bounded FIFO of trajectories: what an IMPALA buffer rank holds between its actors and the learner.

Records go in as they arrive and come out oldest first, each exactly once; nothing is overwritten. A queue that
cannot take a message raises :class:`QueueFull` instead of dropping it: the senders' flow control (the
buffer's actors hold back when their queue is full) is what keeps it from happening. Slot ids and insertion
numbers (``versions``) are reported with every record taken, as a replay memory reports its samples.

With a replay (IMPALA's experience-replay experiments, Espeholt et al. 2018 §5.2.3), :meth:`TrajectoryQueue.take_batch`
mixes the two: ``replayed`` of a batch's rows are drawn uniformly from the last ``replay`` trajectories the queue
served (before this batch), the rest are the oldest waiting, each once, and then join the replay. Until the replay
holds ``replayed`` trajectories a batch is all fresh.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


def slots(spec: dict, capacity: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``capacity`` rows of every field of ``spec``, and each row's insertion number (-1: empty)."""
    data = {name: np.zeros((capacity, *shape), dtype) for name, (shape, dtype) in spec.items()}
    return data, np.full(capacity, -1, dtype=np.int64)


class QueueFull(RuntimeError):
    """More records arrived than the queue has room for."""


class TrajectoryQueue:
    """``capacity`` slots of the record ``spec`` (name -> (shape, dtype)), first in first out."""

    framed: dict = {}  # trajectories carry their observations whole

    def __init__(self, spec: dict, capacity: int, replay: int = 0):
        self.spec, self.capacity = spec, int(capacity)
        self.replay = TrajectoryReplay(spec, replay) if replay else None
        self.data, self.versions = slots(spec, self.capacity)
        self.head = 0  # the oldest record's slot
        self.size = 0  # records waiting
        self.inserted = 0  # records ever added (the next one's version)

    @property
    def nbytes(self) -> int:
        held = self.replay.nbytes if self.replay is not None else 0
        return sum(a.nbytes for a in self.data.values()) + self.versions.nbytes + held

    def room(self) -> int:
        return self.capacity - self.size

    def add(self, records: Mapping[str, np.ndarray]) -> np.ndarray:
        """Append ``records`` (fields of the spec; others are ignored); their slot ids."""
        n = len(records[next(iter(self.spec))])
        if n > self.room():
            raise QueueFull(f"{n} trajectories arrived for a queue holding {self.size} of {self.capacity}")
        ids = (self.head + self.size + np.arange(n)) % self.capacity
        for name, arr in self.data.items():
            arr[ids] = records[name]
        self.versions[ids] = self.inserted + np.arange(n)
        self.inserted += n
        self.size += n
        return ids

    def take_into(self, n: int, out: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Move the oldest ``n`` records into ``out`` (views of the spec's fields, ``n`` rows); their (ids, versions)."""
        if n > self.size:
            raise ValueError(f"{n} trajectories asked of a queue holding {self.size}")
        ids = (self.head + np.arange(n)) % self.capacity
        for name, arr in self.data.items():
            np.take(arr, ids, axis=0, out=out[name])
        versions = self.versions[ids].copy()
        self.head = (self.head + n) % self.capacity
        self.size -= n
        return ids, versions

    def fresh(self, n: int, replayed: int) -> int:
        """How many of a batch of ``n`` come from the waiting records: all until the replay can give ``replayed``."""
        if self.replay is None or self.replay.size < replayed:
            return n
        return n - replayed

    def take_batch(self, n: int, replayed: int, out: Mapping[str, np.ndarray],
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A batch of ``n`` into ``out`` (views of ``n`` rows): the oldest waiting records first, then ``replayed``
        drawn uniformly from the replay once it holds that many (see the module's docstring). Returns (ids,
        versions, probs): each row's slot, insertion number, and the probability it was drawn with (1 for a fresh
        record, 1 / the replay's size for a replayed one)."""
        fresh = self.fresh(n, replayed)
        ids, versions, probs = np.empty(n, np.int64), np.empty(n, np.int64), np.ones(n, np.float64)
        if fresh < n:
            assert self.replay is not None
            rows = {name: view[fresh:] for name, view in out.items()}
            ids[fresh:], versions[fresh:] = self.replay.sample_into(n - fresh, rows, rng)
            probs[fresh:] = 1.0 / self.replay.size
        rows = {name: view[:fresh] for name, view in out.items()}
        ids[:fresh], versions[:fresh] = self.take_into(fresh, rows)
        if self.replay is not None:
            self.replay.add(rows, versions[:fresh])
        return ids, versions, probs


class TrajectoryReplay:
    """The last ``capacity`` trajectories a queue served (a ring: the newest overwrite the oldest), drawn uniformly
    with replacement."""

    def __init__(self, spec: dict, capacity: int):
        self.capacity = int(capacity)
        self.data, self.versions = slots(spec, self.capacity)
        self.next = 0  # the slot the next record goes into
        self.size = 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.data.values()) + self.versions.nbytes

    def add(self, records: Mapping[str, np.ndarray], versions: np.ndarray) -> None:
        n = len(versions)
        if n > self.capacity:  # only the newest fit
            records = {name: arr[n - self.capacity:] for name, arr in records.items()}
            versions, n = versions[n - self.capacity:], self.capacity
        ids = (self.next + np.arange(n)) % self.capacity
        for name, arr in self.data.items():
            arr[ids] = records[name]
        self.versions[ids] = versions
        self.next = (self.next + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample_into(self, n: int, out: Mapping[str, np.ndarray],
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` records drawn uniformly (with replacement) into ``out``; their (slots, insertion numbers)."""
        if not self.size:
            raise ValueError(f"{n} trajectories asked of an empty replay")
        ids = rng.integers(self.size, size=n)
        for name, arr in self.data.items():
            np.take(arr, ids, axis=0, out=out[name])
        return ids, self.versions[ids].copy()
