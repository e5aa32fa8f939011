"""The DistQL Q-server (rank 0): merges the workers' pairs into its table (DistQL Eq. 1) and answers each
exchange with the whole table (``mode = "all"``) or the pairs sent (``"partial"``).

The workers' exchanges come through a :class:`~mpirl.comm.hub.Hub` (one pre-posted receive per worker).
``exchange = "async"``: each exchange is merged and answered as it arrives (the hub's ``"arrival"`` mode).
``"sync"``: the server waits until every worker still playing has sent its round k, merges them in rank order and
answers all (``"rounds"``); the workers meanwhile wait for their reply.

The run ends when every worker has played ``distql.episodes``, or early: at a stop condition of ``[run]``
(``wall_seconds``, ``env_steps`` over all workers, ``target_return`` over the last ``return_window`` episodes) or
a signal on any rank (Ctrl-C through ``mpirl launch``, SIGUSR1, SIGTERM: then "preempted", exit 75). Either way
the stop flag rides in each worker's next reply together with the checkpoint flag: the last cut
(:mod:`mpirl.algos.distql.checkpoint`) is taken as the workers stop, and ``--resume`` continues from it, as from
the cuts taken every ``checkpoint.every_seconds``.

Everything lands in ``qserver.h5``: ``merges``, ``episodes`` and ``workers`` rows (the workers' counters and
finished episodes travel in their exchanges), ``eval`` rows (greedy episodes of the server's table, each cut at
``distql.eval_max_steps``), and at the end the table itself (``table/q``, ``eta``, ``seen`` and per-pair
``merges``). A resumed run drops the rows after its checkpoint and appends.
"""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np
from mpi4py import MPI

from mpirl.agents.tabular import ServerTable
from mpirl.algos.distql import messages as msg
from mpirl.algos.distql.checkpoint import Cut, read_server
from mpirl.comm.backoff import Backoff
from mpirl.comm.hub import Hub
from mpirl.envs.discrete import make_tabular_env
from mpirl.metrics.writer import MetricsFile, Rows
from mpirl.job.checkpoint import identity
from mpirl.job.preemption import PREEMPTED, signal_name

MERGES = {"time": np.float64, "worker": np.int32, "round": np.int64, "pairs_in": np.int64, "new_pairs": np.int64,
          "reply_pairs": np.int64, "bytes_in": np.int64, "bytes_out": np.int64, "merge_s": np.float64}
EPISODES = {"time": np.float64, "worker": np.int32, "episode": np.int64, "return": np.float64,
            "env_return": np.float64, "length": np.int64, "epsilon": np.float64}
WORKERS = {"time": np.float64, "worker": np.int32, "round": np.int64, "episodes": np.int64, "env_steps": np.int64,
           "compute_s": np.float64, "wait_s": np.float64, "torch_imported": np.bool_, "bye": np.bool_}
EVAL = {"time": np.float64, "merges": np.int64, "return_mean": np.float64, "return_std": np.float64,
        "length_mean": np.float64, "episodes": np.int64, "capped": np.int64}
UNITS = {"time": "s", "merge_s": "s", "compute_s": "s", "wait_s": "s", "bytes_in": "B", "bytes_out": "B"}


def evaluate(table: ServerTable, env, episodes: int, rng: np.random.Generator, max_steps: int) -> dict:
    """``episodes`` greedy episodes of the server's table, each cut after ``max_steps`` steps: mean return, its std,
    mean length, and how many were cut."""
    returns, lengths, capped = [], [], 0
    for _ in range(episodes):
        s, ret, n = env.reset(), 0.0, 0
        while True:
            s, r, terminated, truncated = env.step(table.greedy(s, rng))
            ret, n = ret + r, n + 1
            if terminated or truncated:
                break
            if n >= max_steps:
                capped += 1
                break
        returns.append(ret)
        lengths.append(n)
    return {"return_mean": float(np.mean(returns)), "return_std": float(np.std(returns)),
            "length_mean": float(np.mean(lengths)), "episodes": episodes, "capped": capped}


def run_server(ctx) -> str:
    cfg, d, r = ctx.cfg, ctx.cfg.distql, ctx.cfg.run
    comm = ctx.topo.comm("exchange")
    workers = list(range(1, comm.size))
    S, A = ctx.spaces.n_states, ctx.spaces.n_actions
    table = ServerTable(S, A, d.server_eta, d.eta_decay)
    state_in = np.empty(msg.state_nbytes(S * A), np.uint8)  # one worker's state at a time, during a cut
    eval_env = make_tabular_env(cfg.env, d.bins, seed=ctx.seed(2)) if d.eval_episodes else None
    eval_rng = np.random.default_rng(ctx.seed(3))
    f = MetricsFile(ctx.run_dir / "qserver.h5", {"role": "qserver", "rank": 0, "n_states": S, "n_actions": A,
                                                 "workers": len(workers), "mode": d.mode, "exchange": d.exchange,
                                                 "variant": d.variant, "tau": d.tau},
                    flush_seconds=cfg.log.flush_seconds, resume=bool(ctx.resume))
    merges = Rows(f.table("merges", MERGES, UNITS))
    episodes = Rows(f.table("episodes", EPISODES, UNITS))
    stats = Rows(f.table("workers", WORKERS, UNITS))
    evals = Rows(f.table("eval", EVAL, UNITS))
    tables = (merges, episodes, stats, evals)
    finished: set[int] = set()  # workers that said goodbye having played all their episodes (not stopped early)
    env_steps = dict.fromkeys(workers, 0)  # each worker's, as of its last exchange
    returns: deque = deque(maxlen=r.return_window)  # the last episodes' env returns, over all workers
    merged = 0
    if ctx.resume:  # the table, counters and generators of the checkpoint; rows after it describe work done again
        saved = read_server(ctx.resume.checkpoint)
        table.restore(saved["q"], saved["eta"], saved["seen"], saved["merges"])
        merged, finished = saved["merged"], set(saved["finished"])
        returns.extend(saved["returns"].tolist())
        env_steps.update({int(w): n for w, n in saved["server"]["env_steps"].items()})
        eval_rng.bit_generator.state = saved["server"]["eval_rng"]
        if eval_env is not None:
            eval_env.set_rng_state(saved["server"]["eval_env"])
        for rows in tables:
            rows.table.truncate(rows.table.rows_until("time", ctx.resume.job_time))
    # One pre-posted receive per worker still playing (the finished ones of a resumed run have said goodbye); an
    # exchange stays in its inbox until answered: while its round fills up (sync), or held during a cut.
    hub: Hub[msg.Exchange] = Hub(comm, workers, msg.EXCHANGE, msg.exchange_nbytes(S * A, min(d.tau, d.episodes) + 1),
                                 msg.REPLY, msg.reply_nbytes(S * A), finished=finished,
                                 mode="rounds" if d.exchange == "sync" else "arrival")
    sizes: dict[int, int] = {}
    cut: Cut | None = None
    state_recv = MPI.REQUEST_NULL
    stop_reason, stop_cut_due = "", False
    started = last_cut = time.perf_counter()
    status = MPI.Status()
    backoff = Backoff(first=20e-6, longest=2e-3)

    def record(w: int, ex: msg.Exchange) -> None:
        now = ctx.now()
        env_steps[w] = ex.env_steps
        stats.add(time=now, worker=w, round=ex.round, episodes=ex.episodes_done, env_steps=ex.env_steps,
                  compute_s=ex.compute_s, wait_s=ex.wait_s, torch_imported=ex.torch_imported, bye=ex.bye)
        if len(ex.episode):
            returns.extend(ex.env_ret.tolist())
            episodes.extend(time=np.full(len(ex.episode), now), worker=np.full(len(ex.episode), w),
                            episode=ex.episode, **{"return": ex.ret}, env_return=ex.env_ret, length=ex.length,
                            epsilon=ex.epsilon)

    def merge(w: int, ex: msg.Exchange) -> tuple[int, float]:
        nonlocal merged
        start = time.perf_counter()
        new = table.merge(ex.idx, ex.q, ex.eta)
        merged += 1
        return new, time.perf_counter() - start

    def reply(w: int, ex: msg.Exchange, new: int, merge_s: float, full=None) -> None:
        out = hub.outbox(w)
        idx, q, eta = full if full is not None else (table.reply_all() if d.mode == "all"
                                                     else table.reply_partial(ex.idx))
        joins = cut is not None and cut.join(w)  # this reply takes the worker into the cut
        n = msg.pack_reply(out, ex.round, cut is not None and joins and cut.stop, idx, q, eta, checkpoint=joins)
        hub.reply(w, n)  # and the receive of the bye, or the next round
        merges.add(time=ctx.now(), worker=w, round=ex.round, pairs_in=len(ex.idx), new_pairs=new,
                   reply_pairs=len(idx), bytes_in=sizes[w], bytes_out=n, merge_s=merge_s)

    def evaluate_now() -> None:
        evals.add(time=ctx.now(), merges=merged, **evaluate(table, eval_env, d.eval_episodes, eval_rng,
                                                            d.eval_max_steps))

    def handle(w: int) -> None:
        """The exchange in worker ``w``'s inbox: just arrived, or released from hold after a cut."""
        ex = msg.unpack_exchange(hub.inbox(w))
        if not ex.bye and cut is not None and w in cut.members:
            hub.hold(w)  # its next round: after the cut's commit
            return
        sizes[w] = msg.exchange_nbytes(len(ex.idx), len(ex.episode))
        record(w, ex)
        if ex.bye:
            hub.finish(w)
            if ex.episodes_done >= d.episodes:
                finished.add(w)
        elif d.exchange == "async":
            reply(w, ex, *merge(w, ex))
            if eval_env is not None and d.eval_every and merged % d.eval_every == 0:
                evaluate_now()
        else:
            hub.join(w, ex)

    def close_round() -> None:
        """sync: once every worker still playing has sent round k, merge them in rank order and answer all."""
        exchanges = hub.round()
        if exchanges is None:
            return
        rounds = {ex.round for ex in exchanges.values()}
        if len(rounds) != 1:
            raise RuntimeError(f"sync exchange with workers at rounds {sorted(rounds)}")
        results = {w: merge(w, ex) for w, ex in exchanges.items()}  # rank order
        full = table.reply_all() if d.mode == "all" else None
        for w, ex in exchanges.items():
            reply(w, ex, *results[w], full=full)
        if eval_env is not None and d.eval_every and merged // d.eval_every > (merged - len(results)) // d.eval_every:
            evaluate_now()

    def stop_condition() -> str:
        notice = ctx.preempt.requested() if ctx.preempt is not None else None
        if notice is not None:
            rank, signum = notice
            return f"{PREEMPTED}: {signal_name(signum)} on rank {rank} ({ctx.topo.role_of(rank)})"
        if r.wall_seconds and time.perf_counter() - started >= r.wall_seconds:
            return f"wall_seconds {r.wall_seconds:g} reached"
        if r.env_steps and sum(env_steps.values()) >= r.env_steps:
            return f"env_steps {r.env_steps} reached"
        if not math.isnan(r.target_return) and len(returns) == returns.maxlen and np.mean(returns) >= r.target_return:
            return f"mean return of the last {r.return_window} episodes reached {r.target_return:g}"
        return ""

    def commit(done: Cut) -> None:
        """Every row so far on disk, then the checkpoint ``done`` (its job time after all of them)."""
        for rows in tables:
            rows.write()
        f.flush()
        server = {"env_steps": env_steps, "eval_rng": eval_rng.bit_generator.state,
                  "eval_env": eval_env.rng_state() if eval_env is not None else ""}
        done.commit(table, merged, finished, ctx.now(), identity(cfg, comm.size), server, list(returns),
                   cfg.checkpoint.keep)

    def begin_cut(stop: bool) -> None:
        nonlocal cut, state_recv, stop_cut_due
        cut = Cut(ctx.run_dir, set(hub.live), stop=stop)
        state_recv = comm.Irecv(state_in, source=MPI.ANY_SOURCE, tag=msg.STATE)
        stop_cut_due = False

    try:
        while not hub.finished or cut is not None:
            if not stop_reason:
                stop_reason = stop_condition()
                stop_cut_due = bool(stop_reason)
            due = (not stop_reason and cfg.checkpoint.every_seconds
                   and time.perf_counter() - last_cut >= cfg.checkpoint.every_seconds)
            if cut is None and (stop_cut_due or due):
                begin_cut(stop_cut_due)
            busy = False
            if cut is not None and state_recv.Test(status):
                cut.add_state(status.Get_source(), msg.unpack_state(state_in))
                state_recv = comm.Irecv(state_in, source=MPI.ANY_SOURCE, tag=msg.STATE)
                busy = True
            arrived = hub.poll()
            for w in arrived:  # arrival order (within one test, rank order)
                handle(w)
            close_round()
            if cut is not None and cut.complete(hub.done):
                state_recv.Cancel()
                state_recv.Wait()
                commit(cut)
                cut, last_cut = None, time.perf_counter()
                if stop_cut_due:  # a stop that came during a periodic cut: its own cut, the held ones first in it
                    begin_cut(True)
                for w in hub.release():
                    handle(w)
                close_round()
                busy = True
            if arrived or busy:
                backoff.reset()
            else:
                _flush_due(f, tables)
                backoff.sleep()
                continue
            _flush_due(f, tables)
        hub.close()
        if eval_env is not None:
            evaluate_now()
        for rows in tables:
            rows.write()
        g = f.group("table")
        for name, arr in (("q", table.q), ("eta", table.eta), ("seen", table.seen), ("merges", table.merges)):
            g.create_dataset(name, data=arr, compression="gzip")
        return stop_reason or f"{len(workers)} workers played {d.episodes} episodes each ({merged} merges)"
    finally:
        if cut is not None:  # a failure mid-cut: nothing that looks like a checkpoint stays
            cut.abandon()
        f.close()
        if eval_env is not None:
            eval_env.close()


def _flush_due(f: MetricsFile, tables) -> None:
    """Append the gathered rows and flush, every ``flush_seconds``."""
    if f.flush_due():
        for rows in tables:
            rows.write()
        f.flush()
