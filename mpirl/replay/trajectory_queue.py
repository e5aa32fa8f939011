"""A bounded FIFO of trajectories: what an IMPALA buffer rank holds between its actors and the learner.

Records go in as they arrive and come out oldest first, each exactly once; nothing is overwritten. A queue that
cannot take a message raises :class:`QueueFull` instead of dropping it: the senders' flow control (the
buffer's actors hold back when their queue is full) is what keeps it from happening. Slot ids and insertion
numbers (``versions``) are reported with every record taken, as a replay memory reports its samples.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


class QueueFull(RuntimeError):
    """More records arrived than the queue has room for."""


class TrajectoryQueue:
    """``capacity`` slots of the record ``spec`` (name -> (shape, dtype)), first in first out."""

    framed: dict = {}  # trajectories carry their observations whole

    def __init__(self, spec: dict, capacity: int):
        self.spec, self.capacity = spec, int(capacity)
        self.data = {name: np.zeros((self.capacity, *shape), dtype) for name, (shape, dtype) in spec.items()}
        self.versions = np.full(self.capacity, -1, dtype=np.int64)
        self.head = 0  # the oldest record's slot
        self.size = 0  # records waiting
        self.inserted = 0  # records ever added (the next one's version)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.data.values()) + self.versions.nbytes

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
