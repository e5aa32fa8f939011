"""How a worker exchanges its gradients: with the parameter server (:class:`ToServer`, ``async`` and ``sync``) or
with its peers (:class:`Peers`, ``allreduce``). The worker's loop (:mod:`mpirl.gradients.worker`) sees one protocol:

* ``start()`` — the job's parameters (the server's first reply; under ``allreduce`` rank 0's, broadcast), this
  worker's counters (env steps, episodes: a resumed run's, from the checkpoint) and the stop ('' while the job goes
  on: a server that has stopped before a worker's hello tells it so in the reply, and the worker sends nothing);
* ``preempt(rollout, steps)`` — end the rollout now? (DD-PPO's rule; never with a server);
* ``finished_rollout(rollout)`` — tell the others (the shared counter);
* ``update(grad, ...)`` — send one gradient and take the parameters back: the server's reply (and whether it
  dropped the gradient, and whether to stop), or the peers' average, applied here with this rank's optimizer;
* ``end_rollout(...)`` — the stop decision under ``allreduce`` (every rank the same, from shared progress);
* ``finish()``, ``close()``.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from mpirl.agents.schedules import progress_of
from mpirl.comm.collectives import Collectives
from mpirl.comm.counter import SharedCounter, finished_in_round
from mpirl.comm.hub import ask
from mpirl.gradients import messages as msg
from mpirl.gradients.progress import Progress
from mpirl.gradients.rules import preempted
from mpirl.gradients.updates import UpdateLog
from mpirl.job.preemption import PREEMPTED

if TYPE_CHECKING:
    from mpirl.gradients.builder import GradientBuilder, GradientModel


class Outcome(NamedTuple):
    stop: str  # '' while the job goes on
    dropped: bool


class ToServer:
    lockstep = False  # each worker at its own version; the server stops them

    def __init__(self, ctx, builder: GradientBuilder, model: GradientModel):
        self.ctx, self.model = ctx, model
        self.comm = ctx.topo.comm("gradients")  # the server is rank 0
        self.index = self.comm.rank - 1
        n = model.n_params
        self.out = np.empty(msg.message_nbytes(n, msg.max_episodes(ctx.cfg, builder.settings(ctx.cfg))), np.uint8)
        self.back = np.empty(msg.reply_nbytes(n), np.uint8)
        self.version = 0

    def _ask(self, nbytes: int) -> msg.Reply:
        # The server answers within its own short back-off (it takes gradients between its other replies): a long
        # sleep here would be idle time added to every exchange.
        ask(self.comm, 0, self.out[:nbytes], self.back, msg.GRADIENT, msg.REPLY, first=20e-6, longest=500e-6)
        return msg.unpack_reply(self.back, self.model.n_params)

    def start(self) -> tuple[int, int, str]:
        reply = self._ask(msg.pack(self.out, msg.HELLO, 0, 0, 0, 0, {}, np.zeros(0), np.zeros(0), None))
        self.model.load(reply.params)
        self.version = reply.version
        return reply.env_steps, reply.episodes, "stopped by the server" if reply.stop else ""

    def preempt(self, rollout: int, steps: int) -> bool:
        return False

    def job_steps(self, env_steps: int) -> tuple[int, int]:
        """``(train steps, env steps)`` of the job as this worker knows them: the version it has, and its own env
        steps times the workers (they play at about the same pace; the server counts the job's exactly)."""
        return self.version, env_steps * (self.comm.size - 1)

    def finished_rollout(self, rollout: int) -> None:
        pass

    def update(self, grad, stats, rollout, env_steps, episodes, rets, lens) -> Outcome:
        n = msg.pack(self.out, msg.GRAD, self.version, rollout, env_steps, episodes, stats, rets, lens, grad)
        reply = self._ask(n)
        if reply.stop:
            return Outcome("stopped by the server", reply.dropped)
        self.model.load(reply.params)
        self.version = reply.version
        return Outcome("", reply.dropped)

    def end_rollout(self, env_steps, episodes, rets, lens) -> str:
        return ""  # the episodes went with the rollout's first gradient

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


class Peers:
    """DD-PPO: every worker averages its gradient with the others' (``Iallreduce``) and steps its own optimizer;
    identical parameters on every rank, checked by a hash every ``check_every`` updates (the family's settings).
    Ranks on devices of different kinds (a GPU node among CPU nodes, ``agent.device = "auto"``) round the same
    update differently, so there the check is a re-sync instead: rank 0's parameters broadcast to all, and only a
    drift beyond rounding (:data:`DRIFT`) fails the job. Every rank keeps the same :class:`Progress` (each
    rollout's counters and returns are gathered to all), so all decide to stop at the same update; rank 0 adds what
    only it sees (a preemption notice, the wall clock), writes ``updates.h5`` and the checkpoints."""

    FIXED = 4  # stop flag, env steps, episodes, returns carried; then up to run.return_window returns
    DRIFT = 1e-3  # mixed devices: the largest |parameter - rank 0's| a re-sync accepts, relative to rank 0's largest
    lockstep = True  # every rank makes the same updates: the same version everywhere

    def __init__(self, ctx, builder: GradientBuilder, model: GradientModel):
        self.ctx, self.model, self.cfg = ctx, model, ctx.cfg
        self.comm = ctx.topo.comm("gradients")
        self.index, self.W = self.comm.rank, self.comm.size
        self.settings = a = builder.settings(ctx.cfg)
        self.counter = SharedCounter(self.comm) if a.sync_frac < 1 and self.W > 1 else None
        self.coll = Collectives(self.comm)
        self.sum = np.zeros(model.n_params, np.float32)
        self.progress = Progress(ctx, list(range(self.W)))
        self.R = self.cfg.run.return_window
        self.mine = np.zeros(self.FIXED + self.R)
        self.all = np.zeros((self.W, self.FIXED + self.R))
        devices = self.comm.allgather(model.device.type)
        self.mixed = len(set(devices)) > 1
        attrs = {"role": "worker 0", "exchange": "allreduce", "workers": self.W, "device": str(model.device),
                 "devices": ",".join(devices)}
        self.log = UpdateLog(ctx, builder, model.n_params, attrs) if self.index == 0 else None
        self.hash_in = np.zeros(1, np.int64)
        self.hashes = np.zeros(self.W, np.int64)
        self.drift = np.zeros(1)
        self.drifts = np.zeros(self.W)
        self.stop_reason = ""

    @property
    def version(self) -> int:
        return self.progress.version

    def start(self) -> tuple[int, int, str]:
        if self.ctx.resume:
            self.progress.restore(self.model)
        params = self.model.flat_params()
        self.comm.Bcast(params, root=0)  # one source of truth, whatever the seeds did
        self.model.load(params)
        return self.progress.env_steps[self.index], self.progress.episodes[self.index], ""

    def job_steps(self, env_steps: int) -> tuple[int, int]:
        """``(train steps, env steps)`` of the job: every rank's the same (the shared progress)."""
        return self.progress.version, self.progress.total_env_steps

    def preempt(self, rollout: int, steps: int) -> bool:
        if self.counter is None:
            return False
        done = finished_in_round(self.counter.read(), rollout, self.W)
        return preempted(done, self.W, self.settings.sync_frac, steps, 0)

    def finished_rollout(self, rollout: int) -> None:
        if self.counter is not None:
            self.counter.add(1)

    def update(self, grad, stats, rollout, env_steps, episodes, rets, lens) -> Outcome:
        self.reduce(grad)
        self.model.at(progress_of(self.cfg, *self.job_steps(env_steps)))  # every rank the same
        norm = self.model.apply(self.sum, 1.0 / self.W)  # the mean, in the copy into the gradients
        self.progress.version += 1
        v = self.progress.version
        if self.log is not None:
            self.log.add(version=v, worker=0, gradients=self.W, staleness=0.0, applied=True, dropped=0,
                         env_steps=self.progress.total_env_steps, applied_norm=norm,
                         **{k: stats.get(k, float("nan")) for k in msg.STATS})
            self.log.flush_if_due()
        every = self.settings.check_every
        if every and v % every == 0:
            self.check_same()
        return Outcome("", False)

    def reduce(self, grad: np.ndarray) -> None:
        """The workers' gradients summed into ``self.sum`` (:class:`~mpirl.comm.collectives.Collectives`)."""
        self.coll.sum(grad, self.sum)

    def check_same(self) -> None:
        """Every rank's parameters hash the same, or the job fails naming the update; ranks on devices of different
        kinds take rank 0's parameters instead (:meth:`resync`)."""
        if self.mixed:
            self.resync()
            return
        self.hash_in[0] = zlib.crc32(self.model.flat_params().tobytes())
        self.coll.gather(self.hash_in, self.hashes)
        if len(set(self.hashes.tolist())) != 1:
            raise RuntimeError(f"the workers' parameters differ after update {self.version} (hashes "
                               f"{self.hashes.tolist()}): the allreduce or an optimizer went its own way")

    def resync(self) -> None:
        """Rank 0's parameters on every rank (collective); the job fails naming the update when a rank had drifted
        further from them than rounding explains."""
        mine = self.model.flat_params()
        params = mine.copy()
        self.comm.Bcast(params, root=0)
        scale = float(np.abs(params).max()) or 1.0
        self.drift[0] = float(np.abs(mine - params).max()) / scale
        self.model.load(params)
        self.coll.gather(self.drift, self.drifts)
        if self.drifts.max() > self.DRIFT:
            raise RuntimeError(f"the workers' parameters drifted apart by up to {self.drifts.max():.3g} of their "
                               f"largest after update {self.version} (each rank's: {self.drifts.tolist()}), more than "
                               "rounding on devices of different kinds explains: the allreduce or an optimizer went "
                               "its own way")

    def end_rollout(self, env_steps, episodes, rets, lens) -> str:
        """Gather every worker's counters and newest returns; the stop decision, the same on every rank."""
        p, m = self.progress, self.mine
        flag, reason = 0, ""
        if self.index == 0:
            reason = p.stop_reason()
            flag = 1 if reason.startswith(PREEMPTED) else 2 if reason else 0
        k = min(len(rets), self.R)
        m[:self.FIXED] = (flag, env_steps, episodes, k)
        m[self.FIXED:self.FIXED + k] = rets[len(rets) - k:]
        self.coll.gather(m, self.all)
        for w in range(self.W):
            row = self.all[w]
            n = int(row[3])
            p.note(w, int(row[1]), int(row[2]), row[self.FIXED:self.FIXED + n])
        shared = p.stop_reason(ask=False, wall=False)
        first = int(self.all[0, 0])
        if self.index == 0:
            reason = reason if first == 1 else shared or reason
        else:
            reason = shared or ("stopped by worker 0" if first else "")
        if self.index == 0 and (reason or p.save_due()):
            p.save(self.model, self.ctx.topo.world.size)
        self.stop_reason = reason
        return reason

    def finish(self) -> None:
        if self.log is not None and not self.stop_reason.startswith(PREEMPTED):
            self.log.test(self.model, self.version, self.progress.total_env_steps)

    def close(self) -> None:
        if self.counter is not None:
            self.counter.free()
        if self.log is not None:
            self.log.close()


def exchange_for(ctx, builder: GradientBuilder, model: GradientModel) -> ToServer | Peers:
    """The peers under ``allreduce``, else the server."""
    link = Peers if builder.settings(ctx.cfg).exchange == "allreduce" else ToServer
    return link(ctx, builder, model)
