"""The IMPALA buffer: the shared buffer loop (:mod:`mpirl.roles.replay_buffer`) over a trajectory queue.

Receiving the actors' messages, relaying parameters and writing the group's metrics are the replay buffers';
what differs is what the learner is served from (:class:`QueueServer`): each request takes the oldest
trajectories of the queue, once each, and waits until the queue holds them. A message carries the trajectories an
actor's games finished together (``envs_per_actor`` of them; a worker's: its actors').
"""

from __future__ import annotations

import numpy as np

from mpirl.algos.impala.flow import queue_slots
from mpirl.comm.layout import Layout
from mpirl.comm.messages import sample_layout
from mpirl.replay.trajectory_queue import TrajectoryQueue
from mpirl.roles.context import RoleContext
from mpirl.roles.replay_buffer import Buffer


class QueueServer:
    """Trajectories first in, first out; a request is served once the queue holds its share."""

    prioritized = False  # records arrive without priorities (the message's priority field is ignored)

    def __init__(self, buffer: Buffer, share: int) -> None:
        cfg, topo = buffer.cfg, buffer.ctx.topo  # buffer.n_actors: the ranks that send here
        self.memory = TrajectoryQueue(buffer.spec, queue_slots(cfg, len(topo.buffers), buffer.n_actors,
                                                               buffer.exp.max_rows))
        self.ring = None  # no frame pool: trajectories carry their observations
        self.reply = sample_layout(buffer.spec, share)
        self.depth = cfg.comm.prefetch + 1

    def ready(self, want: int) -> bool:
        return self.memory.size >= want

    def fill(self, buf: np.ndarray, want: int, rng: np.random.Generator) -> tuple[int, int]:
        """The oldest ``want`` trajectories into the reply (none at shutdown when fewer wait): (rows, 0)."""
        rows = want if self.memory.size >= want else 0
        views = self.reply.views(buf, rows)
        if rows:
            ids, versions = self.memory.take_into(rows, views)
            views["ids"][:], views["versions"][:] = ids, versions
            views["probs"][:], views["priority"][:] = 1.0, 1.0
        return rows, 0

    def feedback(self, req: Layout, buf: np.ndarray, rows: int) -> tuple[int, int]:
        """Nothing comes back to a queue: each trajectory was trained on once."""
        return 0, 0

    @property
    def total(self) -> float:
        return float(self.memory.size)

    @property
    def reply_total(self) -> float:
        return float(self.memory.size)


class QueueBuffer(Buffer):
    def message_rows(self, games: int) -> int:
        return games  # one trajectory per game a sender steps, all finished together

    def make_server(self, share: int) -> QueueServer:
        return QueueServer(self, share)


def run_buffer(ctx: RoleContext) -> None:
    QueueBuffer(ctx).run()
