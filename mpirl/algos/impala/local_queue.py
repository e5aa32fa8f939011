"""The learner's own trajectory queue (``topology.buffers = 0``): the actors send straight to the learner.

Its intake is the buffer loop's, run in the learner's process (a local buffer over IMPALA's queue
(:class:`~mpirl.algos.impala.queue_server.QueueServer`): it receives the actors' messages into the queue and writes ``buffer_0.h5`` as a buffer rank writes
its file); :class:`LocalQueue` pumps it between train steps and takes each batch from the queue itself, and
:class:`LocalLinks` tells the loop what the actors' messages said (env steps, episodes, returns).
"""

from __future__ import annotations

import time
from typing import Callable, cast

import numpy as np

from mpirl.algos.impala.queue_server import QueueServer
from mpirl.actor_learner.replay_buffer import Buffer
from mpirl.comm.backoff import Backoff
from mpirl.metrics.writer import MetricsFile
from mpirl.actor_learner.batch_sources import Batch, SourceInputs
from mpirl.actor_learner.counters import Counters


class LocalLinks:
    """What the loop asks of its lines to the buffers, for the queue in its own process."""

    def __init__(self, buffer: Buffer, counters: Counters, pump_params: Callable[[], None]):
        """``pump_params``: release the learner's held parameter sends while the last messages come in."""
        self.buffer, self.counters, self.pump_params = buffer, counters, pump_params
        self.env_offset = 0  # a resumed run's actors count on from their last rows before the checkpoint

    def resumed(self, actor_steps: dict[int, int]) -> None:
        self.env_offset = self.counters.env_steps[0] - sum(actor_steps.get(a, 0) for a in self.buffer.actor_steps)

    def absorb(self) -> None:
        """The actors' env steps and finished episodes, from the messages the intake took."""
        c, b = self.counters, self.buffer
        c.env_steps[0] = sum(b.actor_steps.values()) + self.env_offset
        episodes, returns = b.to_learner.take()
        c.episodes += episodes
        c.returns.extend(returns)

    def open_tables(self, file: MetricsFile) -> None:
        """No shards table: the queue's rows are in buffer_0.h5."""

    def write_rows(self) -> None:
        """The queue writes its own rows."""

    def pump(self) -> None:
        """Nothing is held on the way in: the queue's own step takes the actors' messages."""

    def link_bytes(self) -> dict:
        """The actors' messages in (there is no link to a buffer, and nothing goes out on one)."""
        got = self.buffer.exp_pool.bytes_received
        return {"bytes_in": got, "bytes_in_raw": got, "bytes_out": 0, "bytes_out_raw": 0}

    def close(self, train_steps: int) -> None:
        """After the stop's broadcast: take the actors' last messages (each says goodbye), then close the queue."""
        b, backoff = self.buffer, Backoff()
        while b.finals < b.n_actors:
            self.pump_params()  # parameters sent to each actor on its own: the stop to those still due it
            if b.step():
                backoff.reset()
            else:
                backoff.sleep()
        self.absorb()
        b.stop_steps = train_steps
        b.close()


class LocalQueue:
    """Batches of the oldest ``replay.batch_size`` trajectories of the learner's own queue, each once (with
    ``impala.replay_share``, part of each drawn from the trajectories it served before)."""

    def __init__(self, given: SourceInputs):
        self.given, self.batch_size = given, given.cfg.replay.batch_size
        assert given.intake is not None, "a local queue needs the learner's own intake (topology.buffers = 0)"
        self.buffer: Buffer = given.intake()
        self.server = cast(QueueServer, self.buffer.server)  # the builder's: a queue
        self.queue = self.server.memory
        self.links = LocalLinks(self.buffer, given.counters, given.pump_params)
        self.out = {name: np.zeros((self.batch_size, *shape), dtype) for name, (shape, dtype) in given.ctx.spec.items()}
        self.backoff = Backoff()
        self.waited = 0.0  # seconds spent waiting for the next batch's trajectories

    def start(self) -> None:
        """Nothing to ask for: the actors send as they go."""

    def next_batch(self) -> Batch | None:
        with self.given.clock.communicating():
            t = time.perf_counter()
            self.buffer.step()
            self.links.absorb()
            self.waited += time.perf_counter() - t
        server, n = self.server, self.batch_size
        if not server.ready(n):
            return None
        self.backoff.reset()
        _, _, probs = server.take(n, self.out, self.buffer.rng)
        self.buffer.consumed += n
        self.given.counters.consumed[0] += n
        batch = Batch(self.out, np.ones(n, np.float32), probs, self.queue.size, sample_seconds=self.waited)
        self.waited = 0.0
        return batch

    def wait(self) -> None:
        with self.given.clock.communicating():
            t = time.perf_counter()
            self.backoff.sleep()
            self.waited += time.perf_counter() - t

    def give_back(self, batch: Batch, values: np.ndarray) -> None:
        """Nothing goes back: each trajectory was trained on once."""

    def settle(self) -> None:
        """Every batch is counted as it is taken."""
