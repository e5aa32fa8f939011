"""A DistQL worker rank: Q-learning on its own environment, and an exchange with the Q-server after its
episodes 0, tau, 2 tau, ... and after its last.

An exchange sends the pairs changed since the previous one (with the worker's counters and finished
episodes) and waits, with back-off polling, for the server's reply: at once in ``async`` mode, after every
worker's same round in ``sync`` mode. The reply's pairs are applied (``all``: the server's whole table,
``partial``: the pairs sent). A reply with the checkpoint flag makes the worker send its state (table, counters,
generators; :mod:`mpirl.algos.distql.checkpoint`); one with the stop flag ends it. A resumed worker starts from
its state in the checkpoint, or ends at once if it had finished by then.
"""

from __future__ import annotations

import random
import sys
import time

import numpy as np

from mpirl.agents.tabular import WorkerTable, end_penalty, epsilon_at, play_episode
from mpirl.algos.distql import messages as msg
from mpirl.algos.distql.checkpoint import read_worker
from mpirl.comm.backoff import wait_until
from mpirl.comm.hub import ask
from mpirl.envs.delay import Delay
from mpirl.envs.discrete import make_tabular_env


def run_worker(ctx) -> str:
    cfg, d = ctx.cfg, ctx.cfg.distql
    comm = ctx.topo.comm("exchange")  # the server is rank 0, this worker rank = its world rank
    me = comm.rank
    env = make_tabular_env(cfg.env, d.bins, seed=ctx.seed())
    rng = random.Random(ctx.seed(1))
    S, A = ctx.spaces.n_states, ctx.spaces.n_actions
    textbook = d.variant == "textbook"
    table = WorkerTable(S, A, d.gamma, d.eta0, d.eta_decay, textbook=textbook)
    penalty = end_penalty(cfg.env.id, d.end_penalty)
    delays = d.worker_delay_us
    delay = Delay(1e-6 * delays[me - 1 if len(delays) > 1 else 0])
    each_step = delay.step if delay.seconds > 0 else None  # nothing added to an undelayed step
    out = np.empty(msg.exchange_nbytes(S * A, min(d.tau, d.episodes) + 1), np.uint8)
    back = np.empty(msg.reply_nbytes(S * A), np.uint8)
    state_out = None  # made at the first checkpoint
    episodes: list[tuple] = []
    compute_s = wait_s = 0.0
    env_steps = rounds = played = 0
    stop = "done"
    if ctx.resume:
        saved = read_worker(ctx.resume.checkpoint, me)
        if saved is None:  # it had finished: the server knows, and nothing is sent
            env.close()
            return "finished before the checkpoint"
        table.restore(saved.idx, saved.q, saved.eta)
        rng.setstate(saved.rng)
        env.set_rng_state(saved.env_rng)
        played, rounds, env_steps, compute_s, wait_s = (saved.played, saved.rounds, saved.env_steps,
                                                        saved.compute_s, saved.wait_s)
    try:
        for j in range(played, d.episodes):
            start = time.perf_counter()
            eps = epsilon_at(j, d.epsilon, d.epsilon_decay)
            ret, env_ret, length = play_episode(env, table, eps, rng, penalty, textbook, each_step)
            env_steps += length
            played += 1
            episodes.append((j, ret, env_ret, length, eps))
            compute_s += time.perf_counter() - start
            if ctx.preempt is not None:
                ctx.preempt.requested()  # a signal here: tell the server, which stops the job
            last = j == d.episodes - 1
            if j % d.tau and not last:
                continue
            start = time.perf_counter()
            idx, q, eta = table.changed_pairs()
            ep = list(zip(*episodes))
            cols = [np.asarray(c) for c in ep] if ep else [np.zeros(0)] * 5  # episode, ret, env_ret, length, eps
            n = msg.pack_exchange(out, rounds, env_steps, played, last, "torch" in sys.modules, compute_s, wait_s,
                                  idx, q, eta, *cols)
            episodes.clear()
            ask(comm, 0, out[:n], back, msg.EXCHANGE, msg.REPLY)
            reply = msg.unpack_reply(back)
            if reply.round != rounds:
                raise RuntimeError(f"the server answered round {reply.round}, this worker sent round {rounds}")
            if d.mode == "all":
                table.apply_all(reply.idx, reply.q, reply.eta)
            else:
                table.apply_partial(reply.idx, reply.q)
            rounds += 1
            wait_s += time.perf_counter() - start
            if reply.checkpoint:  # after the reply: the table the server's cut holds, nothing changed since
                state_out = state_out if state_out is not None else np.empty(msg.state_nbytes(S * A), np.uint8)
                n = msg.pack_state(state_out, msg.State(played, rounds, env_steps, last, compute_s, wait_s,
                                                        rng.getstate(), env.rng_state(), *table.seen_pairs()))
                send = comm.Isend(state_out[:n], dest=0, tag=msg.STATE)
                wait_until(send.Test, first=50e-6, longest=5e-3)
            if reply.stop and not last:
                stop = f"stopped by the server after episode {j + 1} of {d.episodes}"
                break
        empty = np.zeros(0)
        n = msg.pack_exchange(out, rounds, env_steps, played, True, "torch" in sys.modules, compute_s,
                              wait_s, np.zeros(0, np.int32), empty, empty, np.zeros(0, np.int64), empty, empty,
                              np.zeros(0, np.int64), empty, bye=True)
        comm.Send(out[:n], dest=0, tag=msg.EXCHANGE)
    finally:
        env.close()
    return stop
