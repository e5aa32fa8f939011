"""The parameter server (rank 0 when the family's ``exchange`` is ``"async"`` or ``"sync"``): it holds the
parameters and the optimizer, applies the workers' gradients and answers each with the parameters and their
version.

The workers' messages come through a :class:`~mpirl.comm.hub.Hub` (one pre-posted receive per worker, ``Testsome``,
arrival order). A message stays in its worker's inbox until answered, so a synchronous round's gradients are read
there when the round closes. The rules (:mod:`mpirl.gradients.rules`):

* ``async`` (A3C, Gorila): each gradient is applied as it arrives unless it is more than ``max_staleness``
  updates old (then dropped and counted); the worker is answered at once with the parameters after it.
* ``sync`` (DPPO): gradients of the current version join the round; once ``workers - stragglers`` are in, they
  are averaged in rank order, applied, and the round's workers answered. A gradient of an older version (a
  straggler's, its round closed) is dropped and its worker answered at once with the current parameters.

A hello (a worker's first message) is answered with the parameters and, in a resumed run, the worker's counters.
The stop (``[run]``'s conditions, or a signal on any rank: then "preempted", exit 75, after a checkpoint) rides in
each worker's next reply; a worker told to stop sends nothing more.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from mpirl.comm.backoff import Backoff
from mpirl.comm.hub import Hub
from mpirl.agents.schedules import progress_of
from mpirl.gradients import messages as msg
from mpirl.gradients.builder import GradientBuilder
from mpirl.gradients.progress import Progress
from mpirl.gradients.rules import Rounds, accept
from mpirl.gradients.updates import UpdateLog
from mpirl.job.preemption import PREEMPTED


class Server:
    """The server's loop: its model, progress, hub and log, and the stop once decided (``stop``, '' until then)."""

    def __init__(self, ctx, builder: GradientBuilder) -> None:
        cfg, a = ctx.cfg, builder.settings(ctx.cfg)
        torch.set_num_threads(cfg.agent.torch_threads)
        self.ctx, self.a = ctx, a
        comm = ctx.topo.comm("gradients")
        workers = list(range(1, comm.size))
        self.model = builder.make_model(ctx, optimizer=True)
        self.n = n = self.model.n_params
        self.progress = Progress(ctx, workers)
        if ctx.resume:
            self.progress.restore(self.model)
        self.log = UpdateLog(ctx, builder, n, {"role": "server", "exchange": a.exchange, "workers": len(workers),
                                      "device": str(self.model.device)})
        self.hub: Hub[None] = Hub(comm, workers, msg.GRADIENT, msg.message_nbytes(n, msg.max_episodes(cfg, a)),
                                  msg.REPLY, msg.reply_nbytes(n))
        self.rounds = Rounds(len(workers), a.stragglers) if a.exchange == "sync" else None
        self.total = np.zeros(n, np.float32)  # sync: the round's gradients, summed in rank order
        self.stop = ""
        self.busy_s = 0.0  # seconds spent handling what arrived (written at the end: busy_s)
        self.backoff = Backoff(first=10e-6, longest=200e-6)  # a gradient waits no longer than this to be seen

    def answer(self, w: int, dropped: bool, same: np.ndarray | None = None) -> np.ndarray:
        """Reply to ``w`` with the current parameters: straight from the model, or copied from ``same`` (another
        reply's of this version: a round's workers cost one read of the model, on a GPU one transfer)."""
        hub, progress = self.hub, self.progress
        out = hub.outbox(w)
        nbytes, params = msg.pack_reply(out, progress.version, bool(self.stop), dropped, self.n,
                                        progress.env_steps[w], progress.episodes[w])
        if same is None:
            self.model.flat_params(out=params)
        else:
            params[:] = same
        hub.reply(w, nbytes)
        if self.stop:
            hub.finish(w)  # it sends nothing more
        return params

    def answer_all(self, members: list[int]) -> None:
        same = None
        for w in members:
            same = self.answer(w, False, same)

    def applied(self, grad: np.ndarray, scale: float = 1.0) -> float:
        p = self.progress
        self.model.at(progress_of(self.ctx.cfg, p.version, p.total_env_steps))  # the learning rate's schedule
        norm = self.model.apply(grad, scale)
        self.progress.version += 1
        return norm

    def logged(self, worker: int, gradients: int, staleness: float, applied: bool, norm: float,
               stats: dict) -> None:
        """A row of ``updates``: what came from ``worker`` (-1: a synchronous round) and what was done with it."""
        p = self.progress
        self.log.add(version=p.version, worker=worker, gradients=gradients, staleness=staleness, applied=applied,
                     dropped=p.dropped, env_steps=p.total_env_steps, applied_norm=norm, **stats)

    def close_round(self) -> None:
        assert self.rounds is not None
        members = self.rounds.close()
        total = self.total
        total[:] = 0
        stats = []
        for w in members:  # rank order: the same sum whatever order they came in
            m = msg.unpack(self.hub.inbox(w), self.hub.nbytes_in(w))
            total[:] += m.grad
            stats.append(m.stats)
        norm = self.applied(total, 1.0 / len(members))  # their mean (the moments they carry: their sum)
        self.logged(-1, len(members), 0.0, True, norm,
                    {k: float(np.mean([s[k] for s in stats])) for k in msg.STATS})
        self.answer_all(members)

    def handle(self, w: int) -> None:
        """The message in ``w``'s inbox: a hello, or a gradient (applied, joined to the round, or dropped)."""
        progress, rounds = self.progress, self.rounds
        m = msg.unpack(self.hub.inbox(w), self.hub.nbytes_in(w))
        if m.kind == msg.HELLO:
            self.answer(w, False)
            return
        progress.note(w, m.env_steps, m.episodes, m.returns)
        if self.stop:
            self.answer(w, False)  # not applied: the job has stopped
        elif rounds is None:
            ok, staleness = accept(progress.version, m.version, self.a.max_staleness)
            if ok:
                norm = self.applied(m.grad)
            else:
                norm = float("nan")
                self.model.fold(m.grad)  # what the worker saw counts, whatever its gradient's age
            progress.dropped += not ok
            self.logged(w, 1, float(staleness), ok, norm, {k: m.stats.get(k, float("nan")) for k in msg.STATS})
            self.answer(w, not ok)
        elif rounds.offer(w, m.version, progress.version):
            if rounds.ready():
                self.close_round()
        else:
            progress.dropped += 1
            self.model.fold(m.grad)
            self.answer(w, True)

    def check_stop(self) -> None:
        if not self.stop:
            self.stop = self.progress.stop_reason()
            if self.stop and self.rounds is not None:
                self.answer_all(self.rounds.close())  # the open round's workers wait: they get the stop now

    def step(self) -> None:
        """One turn: the stop asked, the messages that arrived handled, a checkpoint when due, the log flushed."""
        self.check_stop()
        arrived = self.hub.poll()
        start = time.perf_counter()
        for w in arrived:
            self.handle(w)
            self.check_stop()  # before the next: not one update past run.train_steps
        if arrived:
            self.busy_s += time.perf_counter() - start
        if not self.stop and self.progress.save_due():
            self.progress.save(self.model, self.ctx.topo.world.size)
        self.log.flush_if_due()
        if arrived:
            self.backoff.reset()
        else:
            self.backoff.sleep()

    def run(self) -> str:
        """Until every worker has been told to stop; then the last checkpoint and, unless preempted, the test."""
        p = self.progress
        wall, version = time.perf_counter(), p.version
        try:
            while not self.hub.finished:
                self.step()
            # what serving cost this rank: the seconds it spent handling messages (not polling or asleep), its loop's
            # wall seconds and the updates made in it (the scaling model's server time, mpirl.bench.scaling_check)
            self.log.file.set_attrs(busy_s=self.busy_s, loop_s=time.perf_counter() - wall,
                                    loop_updates=p.version - version)
            self.hub.close()
            p.save(self.model, self.ctx.topo.world.size)
            if not self.stop.startswith(PREEMPTED):  # a preempted job's grace time is for the checkpoint
                self.log.test(self.model, p.version, p.total_env_steps)
            return self.stop
        finally:
            self.log.close()


def run_server(ctx, builder: GradientBuilder) -> str:
    return Server(ctx, builder).run()
