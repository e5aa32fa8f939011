"""What an actor of a replay-based algorithm ships: staged records, packed into a ring of send buffers.

:class:`Staging` holds records waiting to be sent (one preallocated array per field of the record
spec, rows put in spec order); :class:`ExperienceSender` packs a batch of them with their priorities,
the actor's counters and its finished episodes into the experience layout and sends it to the buffer
with ``Isend``. Ape-X stages n-step transitions, QMIX whole episodes.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from mpirl.comm.messages import EPISODE_SLOTS, TAG_EXPERIENCE, experience_layout
from mpirl.comm.pools import SendRing


class Staging:
    """Transitions waiting to be sent: one preallocated array per field."""

    def __init__(self, spec: dict, rows: int):
        self.fields = {name: np.zeros((rows, *shape), dtype) for name, (shape, dtype) in spec.items()}
        self.count = 0

    def put(self, row: tuple) -> None:
        """One record, its fields in the spec's order."""
        for arr, value in zip(self.fields.values(), row):
            arr[self.count] = value
        self.count += 1

    def take(self, n: int) -> dict:
        """Views of the first ``n`` rows (valid until ``drop(n)``)."""
        return {name: arr[:n] for name, arr in self.fields.items()}

    def drop(self, n: int) -> None:
        """Forget the first ``n`` rows, moving the rest to the front."""
        rest = self.count - n
        if rest:
            for arr in self.fields.values():
                arr[:rest] = arr[n:self.count]
        self.count = rest


class ExperienceSender:
    """An actor's line to its buffer: batches packed into a ring of send buffers, ``Isend``."""

    def __init__(self, comm, spec: dict, send_batch: int, ring_size: int, rank: int):
        self.layout = experience_layout(spec, send_batch)
        self.ring = SendRing(comm, dest=0, tag=TAG_EXPERIENCE, nbytes=self.layout.max_nbytes, size=ring_size)
        self.rank = rank
        self.sent = 0

    def send(self, records: dict, priorities: np.ndarray, episodes: deque, final: bool = False, **header) -> None:
        """Pack and send ``records`` with their priorities and up to EPISODE_SLOTS finished episodes."""
        slot, buf = self.ring.acquire()
        k = min(len(episodes), EPISODE_SLOTS)
        done_eps = [episodes.popleft() for _ in range(k)]
        nbytes = self.layout.pack(buf, {**records, "priority": priorities}, actor=self.rank, final=int(final),
                                  episodes=k, ep_return=[r for r, _ in done_eps], ep_length=[n for _, n in done_eps],
                                  **header)
        self.ring.send(slot, nbytes)
        self.sent += len(priorities)

    def close(self) -> None:
        self.ring.close()
