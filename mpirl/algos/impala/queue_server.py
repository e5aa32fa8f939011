"""What an IMPALA buffer serves from: the shared buffer loop (:mod:`mpirl.actor_learner.replay_buffer`) over a
trajectory queue.

Receiving the actors' messages, relaying parameters and writing the group's metrics are the replay buffers';
what differs is what the learner is served from (:class:`QueueServer`): each request takes the oldest
trajectories of the queue, once each, and waits until the queue holds them; with ``impala.replay_share`` part of
each reply is drawn from the trajectories the queue served before (its replay). A message carries the trajectories an
actor's games finished together (``envs_per_actor`` of them; a worker's: its actors').
"""

from __future__ import annotations

import numpy as np

from mpirl.algos.impala.flow import Windows, queue_slots, window
from mpirl.algos.impala.settings import replayed
from mpirl.comm.credit import CreditGrants
from mpirl.comm.layout import Layout
from mpirl.comm.messages import episode_slots, sample_layout
from mpirl.replay.trajectory_queue import TrajectoryQueue
from mpirl.actor_learner.buffer_servers import Buffer, Server


class QueueCredit:
    """The queue's side of its senders' windows (:mod:`mpirl.algos.impala.flow`): the ledger, and the lines that
    tell each sender its total (:mod:`mpirl.comm.credit`)."""

    def __init__(self, comm, senders: list[int], size: int) -> None:
        self.windows = Windows(senders, size)
        self.lines = CreditGrants(comm, senders)

    def arrived(self, sender: int, rows: int, final: bool) -> None:
        self.windows.arrived(sender, rows)
        if final:  # its goodbye: its line ends
            self.lines.close(sender)

    def taken(self, rows: int) -> None:
        """The learner took the ``rows`` oldest trajectories: their senders' room back."""
        for sender in self.windows.take(rows):
            self.lines.grant(sender, self.windows.granted(sender))


class QueueServer(Server):
    """Trajectories first in, first out; a request is served once the queue holds its share."""

    prioritized = False  # records arrive without priorities (the message's priority field is ignored)

    def __init__(self, buffer: Buffer, share: int) -> None:
        cfg, topo = buffer.cfg, buffer.ctx.topo  # buffer.n_actors: the ranks that send here
        queues = len(topo.buffers)
        self.memory = TrajectoryQueue(buffer.spec, queue_slots(cfg, queues, buffer.n_actors, buffer.exp.max_rows),
                                      replay=cfg.impala.replay_capacity)
        self.replayed = replayed(cfg, queues)  # of each share, drawn from the replay once it holds them
        self.served_again = 0  # trajectories served from the replay since the buffer's last row
        self.ring = None  # no frame pool: trajectories carry their observations
        self.reply = sample_layout(buffer.spec, share, episodes=episode_slots(buffer.cfg.run.return_window))
        self.depth = cfg.comm.prefetch + 1
        # Asynchronous exchange: each sender's window, given back as the learner takes its trajectories.
        senders = list(range(1, buffer.n_actors + 1))  # their ranks in the group
        self.credit = (QueueCredit(topo.group, senders, window(cfg, buffer.n_actors))
                       if cfg.impala.exchange == "async" else None)

    def ready(self, want: int) -> bool:
        return self.memory.size >= self.memory.fresh(want, self.replayed)

    def take(self, n: int, out: dict, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` trajectories into ``out``: the oldest waiting, and any replayed; (ids, versions, probs)."""
        fresh = self.memory.fresh(n, self.replayed)
        self.served_again += n - fresh
        if self.credit is not None:
            self.credit.taken(fresh)
        return self.memory.take_batch(n, self.replayed, out, rng)

    def fill(self, buf: np.ndarray, want: int, rng: np.random.Generator) -> tuple[int, int]:
        """``want`` trajectories into the reply, the oldest waiting and any replayed (none at shutdown when fewer
        wait): (rows, 0). A row's ``probs`` is the probability it was drawn with (below 1: replayed)."""
        rows = want if self.ready(want) else 0
        views = self.reply.views(buf, rows)
        if rows:
            ids, versions, probs = self.take(rows, views, rng)
            views["ids"][:], views["versions"][:] = ids, versions
            views["probs"][:], views["priority"][:] = probs, 1.0
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

    def arrived(self, source: int, rows: int, final: bool) -> None:
        """With windows a message's rows count against its sender's, and its last closes the sender's credit line."""
        if self.credit is not None:
            self.credit.arrived(source, rows, final)

    def turn(self) -> bool:
        """The credit granted since the last turn, sent."""
        return self.credit is not None and self.credit.lines.flush()

    def columns(self) -> dict:
        return {"replayed": np.int64}  # trajectories served from the replay since the last row

    def row(self) -> dict:
        n, self.served_again = self.served_again, 0
        return {"replayed": n}

    def close(self) -> None:
        """Every sender has said goodbye: its line ends before the communicator does."""
        if self.credit is not None:
            self.credit.lines.finish()
