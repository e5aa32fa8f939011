"""A worker rank of the exchange family: learning on its own environment, and an exchange with the server after
its episodes 0, tau, 2 tau, ... and after its last (DistQL's: Q-learning, its table's pairs to the Q-server).

An exchange sends the pairs changed since the previous one (with the worker's counters and finished
episodes) and waits, with back-off polling, for the server's reply: at once in ``async`` mode, after every
worker's same round in ``sync`` mode. The reply's pairs are applied (``all``: the server's whole table,
``partial``: the pairs sent). A reply with the checkpoint flag makes the worker send its state (table, counters,
generators; :mod:`mpirl.exchange.checkpoint`); one with the stop flag ends it. A resumed worker starts from
its state in the checkpoint, or ends at once if it had finished by then. What it plays and learns with is its
algorithm's (:class:`~mpirl.exchange.builder.ExchangeBuilder`).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np

from mpirl.comm.backoff import wait_until
from mpirl.comm.hub import ask
from mpirl.envs.delay import Delay
from mpirl.exchange import messages as msg
from mpirl.exchange.builder import LINK, ExchangeBuilder, WorkerTable
from mpirl.exchange.checkpoint import read_worker
from mpirl.job.checkpoint import Resume
from mpirl.job.context import RoleContext


class Worker:
    """The worker's loop: its environment, table, buffers and counters, and how it ended (``stop``)."""

    def __init__(self, ctx: RoleContext, builder: ExchangeBuilder) -> None:
        cfg = ctx.cfg
        self.ctx, self.builder = ctx, builder
        self.d = d = builder.settings(cfg)  # the family's settings: the algorithm's section
        self.comm = ctx.topo.comm(LINK)  # the server is rank 0, this worker rank = its world rank
        me = self.comm.rank
        self.env = builder.make_env(cfg, ctx.seed())
        self.rng = random.Random(ctx.seed(1))
        self.pairs = ctx.spaces.n_states * ctx.spaces.n_actions
        self.table: WorkerTable = builder.make_worker_table(cfg, ctx.spaces)
        delays = d.worker_delay_us
        delay = Delay(1e-6 * delays[me - 1 if len(delays) > 1 else 0])
        self.each_step = delay.step if delay.seconds > 0 else None  # nothing added to an undelayed step
        self.out = np.empty(msg.exchange_nbytes(self.pairs, min(d.tau, d.episodes) + 1), np.uint8)
        self.back = np.empty(msg.reply_nbytes(self.pairs), np.uint8)
        self.state_out: np.ndarray | None = None  # made at the first checkpoint
        self.episodes: list[tuple] = []
        self.compute_s = self.wait_s = 0.0
        self.env_steps = self.rounds = self.played = 0
        self.stop = "done"

    def resume(self, resume: Resume) -> bool:
        """This worker's state at the checkpoint being resumed; False when it had finished by then."""
        saved = read_worker(Path(resume.checkpoint), self.comm.rank)
        if saved is None:
            return False
        self.table.restore(saved.idx, saved.q, saved.eta)
        self.rng.setstate(saved.rng)
        self.env.set_rng_state(saved.env_rng)
        self.played, self.rounds, self.env_steps, self.compute_s, self.wait_s = (
            saved.played, saved.rounds, saved.env_steps, saved.compute_s, saved.wait_s)
        return True

    def step(self, j: int) -> bool:
        """Episode ``j`` played, and the exchange after it when one is due; False once the server stopped the
        worker."""
        d = self.d
        start = time.perf_counter()
        played = self.builder.play_episode(self.ctx.cfg, self.env, self.table, j, self.rng, self.each_step)
        self.env_steps += played.length
        self.played += 1
        self.episodes.append((j, *played))
        self.compute_s += time.perf_counter() - start
        if self.ctx.preempt is not None:
            self.ctx.preempt.requested()  # a signal here: tell the server, which stops the job
        last = j == d.episodes - 1
        if j % d.tau and not last:
            return True
        reply = self.exchange(last)
        if reply.checkpoint:  # after the reply: the table the server's cut holds, nothing changed since
            self.send_state(last)
        if reply.stop and not last:
            self.stop = f"stopped by the server after episode {j + 1} of {d.episodes}"
            return False
        return True

    def exchange(self, last: bool) -> msg.Reply:
        """The pairs changed and the episodes finished since the last exchange, sent; the server's reply applied."""
        start = time.perf_counter()
        table = self.table
        idx, q, eta = table.changed_pairs()
        ep = list(zip(*self.episodes))
        cols = [np.asarray(c) for c in ep] if ep else [np.zeros(0)] * 5  # episode, ret, env_ret, length, eps
        n = msg.pack_exchange(self.out, self.rounds, self.env_steps, self.played, last, "torch" in sys.modules,
                              self.compute_s, self.wait_s, idx, q, eta, *cols)
        self.episodes.clear()
        ask(self.comm, 0, self.out[:n], self.back, msg.EXCHANGE, msg.REPLY)
        reply = msg.unpack_reply(self.back)
        if reply.round != self.rounds:
            raise RuntimeError(f"the server answered round {reply.round}, this worker sent round {self.rounds}")
        if self.d.mode == "all":
            table.apply_all(reply.idx, reply.q, reply.eta)
        else:
            table.apply_partial(reply.idx, reply.q)
        self.rounds += 1
        self.wait_s += time.perf_counter() - start
        return reply

    def send_state(self, last: bool) -> None:
        """This worker's state (table, counters, generators) to the server's cut."""
        if self.state_out is None:
            self.state_out = np.empty(msg.state_nbytes(self.pairs), np.uint8)
        n = msg.pack_state(self.state_out, msg.State(self.played, self.rounds, self.env_steps, last, self.compute_s,
                                                     self.wait_s, self.rng.getstate(), self.env.rng_state(),
                                                     *self.table.seen_pairs()))
        send = self.comm.Isend(self.state_out[:n], dest=0, tag=msg.STATE)
        wait_until(send.Test, first=50e-6, longest=5e-3)

    def bye(self) -> None:
        """The goodbye: the worker's counters and no pairs."""
        empty = np.zeros(0)
        n = msg.pack_exchange(self.out, self.rounds, self.env_steps, self.played, True, "torch" in sys.modules,
                              self.compute_s, self.wait_s, np.zeros(0, np.int32), empty, empty,
                              np.zeros(0, np.int64), empty, empty, np.zeros(0, np.int64), empty, bye=True)
        self.comm.Send(self.out[:n], dest=0, tag=msg.EXCHANGE)

    def run(self) -> str:
        """Episodes until its last or the server's stop (a resumed worker from the checkpoint's), then goodbye."""
        if self.ctx.resume and not self.resume(self.ctx.resume):  # it had finished: the server knows, and nothing is sent
            self.env.close()
            return "finished before the checkpoint"
        try:
            for j in range(self.played, self.d.episodes):
                if not self.step(j):
                    break
            self.bye()
        finally:
            self.env.close()
        return self.stop


def run_worker(ctx: RoleContext, builder: ExchangeBuilder) -> str:
    return Worker(ctx, builder).run()
