"""The parameter server (rank 0 under ``a3c.exchange`` = ``"async"`` or ``"sync"``): it holds the parameters and the
optimizer, applies the workers' gradients and answers each with the parameters and their version.

The workers' messages come through a :class:`~mpirl.comm.hub.Hub` (one pre-posted receive per worker, ``Testsome``,
arrival order). A message stays in its worker's inbox until answered, so a synchronous round's gradients are read
there when the round closes. The rules (:mod:`mpirl.algos.a3c.rules`):

* ``async`` (A3C, Gorila): each gradient is applied as it arrives unless it is more than ``a3c.max_staleness``
  updates old (then dropped and counted); the worker is answered at once with the parameters after it.
* ``sync`` (DPPO): gradients of the current version join the round; once ``workers - stragglers`` are in, they
  are averaged in rank order, applied, and the round's workers answered. A gradient of an older version (a
  straggler's, its round closed) is dropped and its worker answered at once with the current parameters.

A hello (a worker's first message) is answered with the parameters and, in a resumed run, the worker's counters.
The stop (``[run]``'s conditions, or a signal on any rank: then "preempted", exit 75, after a checkpoint) rides in
each worker's next reply; a worker told to stop sends nothing more.
"""

from __future__ import annotations

import numpy as np
import torch

from mpirl.agents.a3c import A3cModel
from mpirl.agents.dqn import pick_device
from mpirl.algos.a3c import messages as msg
from mpirl.algos.a3c.exchange import max_episodes
from mpirl.algos.a3c.progress import Progress
from mpirl.algos.a3c.rules import Rounds, accept
from mpirl.algos.a3c.updates import UpdateLog
from mpirl.comm.backoff import Backoff
from mpirl.comm.hub import Hub
from mpirl.job.preemption import PREEMPTED


def run_server(ctx) -> str:
    cfg, a = ctx.cfg, ctx.cfg.a3c
    torch.set_num_threads(cfg.agent.torch_threads)
    comm = ctx.topo.comm("gradients")
    workers = list(range(1, comm.size))
    model = A3cModel(ctx.spaces.obs_shape, ctx.spaces.n_actions, cfg.agent, a, pick_device(cfg.agent.device),
                     seed=cfg.run.seed, optimizer=True)
    n = model.n_params
    progress = Progress(ctx, workers)
    if ctx.resume:
        progress.restore(model)
    log = UpdateLog(ctx, n, {"role": "server", "exchange": a.exchange, "workers": len(workers),
                             "device": str(model.device)})
    hub: Hub[None] = Hub(comm, workers, msg.GRADIENT, msg.message_nbytes(n, max_episodes(cfg)), msg.REPLY,
                         msg.reply_nbytes(n))
    rounds = Rounds(len(workers), a.stragglers) if a.exchange == "sync" else None
    total = np.zeros(n, np.float32)  # sync: the round's gradients, summed in rank order
    stop = ""
    backoff = Backoff(first=10e-6, longest=200e-6)  # a gradient waits no longer than this to be seen

    def answer(w: int, dropped: bool, same: np.ndarray | None = None) -> np.ndarray:
        """Reply to ``w`` with the current parameters: straight from the model, or copied from ``same`` (another
        reply's of this version: a round's workers cost one read of the model, on a GPU one transfer)."""
        out = hub.outbox(w)
        nbytes, params = msg.pack_reply(out, progress.version, bool(stop), dropped, n, progress.env_steps[w],
                                        progress.episodes[w])
        if same is None:
            model.flat_params(out=params)
        else:
            params[:] = same
        hub.reply(w, nbytes)
        if stop:
            hub.finish(w)  # it sends nothing more
        return params

    def answer_all(members: list[int]) -> None:
        same = None
        for w in members:
            same = answer(w, False, same)

    def applied(grad: np.ndarray) -> float:
        norm = model.apply(grad)
        progress.version += 1
        return norm

    def close_round() -> None:
        assert rounds is not None
        members = rounds.close()
        total[:] = 0
        stats = []
        for w in members:  # rank order: the same sum whatever order they came in
            m = msg.unpack(hub.inbox(w), hub.nbytes_in(w))
            total[:] += m.grad
            stats.append(m.stats)
        total[:] /= len(members)
        norm = applied(total)
        log.add(version=progress.version, worker=-1, gradients=len(members), staleness=0.0, applied=True,
                dropped=progress.dropped, env_steps=progress.total_env_steps, applied_norm=norm,
                **{k: float(np.mean([s[k] for s in stats])) for k in msg.STATS})
        answer_all(members)

    def handle(w: int) -> None:
        m = msg.unpack(hub.inbox(w), hub.nbytes_in(w))
        if m.kind == msg.HELLO:
            answer(w, False)
            return
        progress.note(w, m.env_steps, m.episodes, m.returns)
        if stop:
            answer(w, False)  # not applied: the job has stopped
        elif rounds is None:
            ok, staleness = accept(progress.version, m.version, a.max_staleness)
            norm = applied(m.grad) if ok else float("nan")
            progress.dropped += not ok
            log.add(version=progress.version, worker=w, gradients=1, staleness=float(staleness), applied=ok,
                    dropped=progress.dropped, env_steps=progress.total_env_steps, applied_norm=norm,
                    **{k: m.stats.get(k, float("nan")) for k in msg.STATS})
            answer(w, not ok)
        elif rounds.offer(w, m.version, progress.version):
            if rounds.ready():
                close_round()
        else:
            progress.dropped += 1
            answer(w, True)

    def check_stop() -> None:
        nonlocal stop
        if not stop:
            stop = progress.stop_reason()
            if stop and rounds is not None:
                answer_all(rounds.close())  # the open round's workers wait: they get the stop now

    try:
        while not hub.finished:
            check_stop()
            arrived = hub.poll()
            for w in arrived:
                handle(w)
                check_stop()  # before the next: not one update past run.train_steps
            if not stop and progress.save_due():
                progress.save(model, ctx.topo.world.size)
            log.flush_if_due()
            if arrived:
                backoff.reset()
            else:
                backoff.sleep()
        hub.close()
        progress.save(model, ctx.topo.world.size)
        if not stop.startswith(PREEMPTED):  # a preempted job's grace time is for the checkpoint
            log.test(model, progress.version, progress.total_env_steps)
        return stop
    finally:
        log.close()
