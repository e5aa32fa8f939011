"""The DistQL Q-server (rank 0): merges the workers' pairs into its table (DistQL Eq. 1) and answers each
exchange with the whole table (``mode = "all"``) or the pairs sent (``"partial"``).

Receives are pre-posted, one per worker. ``exchange = "async"``: each exchange is merged and answered as it
arrives (``Testsome``). ``"sync"``: the server waits until every worker still playing has sent its round k,
merges them in rank order and answers all; the workers meanwhile wait for their reply. A signal on any rank
(Ctrl-C through ``mpirl launch``, SIGUSR1, SIGTERM) puts the stop flag in every later reply: DistQL keeps no
checkpoint, so the run ends early and cannot be resumed.

Everything lands in ``qserver.h5``: ``merges``, ``episodes`` and ``workers`` rows (the workers' counters and
finished episodes travel in their exchanges), ``eval`` rows (greedy episodes of the server's table), and at the
end the table itself (``table/q``, ``eta``, ``seen`` and per-pair ``merges``).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from mpirl.agents.tabular import ServerTable
from mpirl.algos.distql import messages as msg
from mpirl.comm.backoff import Backoff
from mpirl.envs.discrete import make_tabular_env
from mpirl.metrics.writer import MetricsFile
from mpirl.roles.preemption import STOPPED, signal_name

MERGES = {"time": np.float64, "worker": np.int32, "round": np.int64, "pairs_in": np.int64, "new_pairs": np.int64,
          "reply_pairs": np.int64, "bytes_in": np.int64, "bytes_out": np.int64, "merge_s": np.float64}
EPISODES = {"time": np.float64, "worker": np.int32, "episode": np.int64, "return": np.float64,
            "env_return": np.float64, "length": np.int64, "epsilon": np.float64}
WORKERS = {"time": np.float64, "worker": np.int32, "round": np.int64, "episodes": np.int64, "env_steps": np.int64,
           "compute_s": np.float64, "wait_s": np.float64, "torch_imported": np.bool_, "bye": np.bool_}
EVAL = {"time": np.float64, "merges": np.int64, "return_mean": np.float64, "return_std": np.float64,
        "length_mean": np.float64, "episodes": np.int64}
UNITS = {"time": "s", "merge_s": "s", "compute_s": "s", "wait_s": "s", "bytes_in": "B", "bytes_out": "B"}


class Rows:
    """Rows of one table gathered in lists and appended in blocks (at a flush), not one HDF5 resize a row."""

    def __init__(self, table):
        self.table = table
        self.cols: dict[str, list] = {c: [] for c in table.columns}

    def add(self, **row) -> None:
        for c, v in row.items():
            self.cols[c].append(v)

    def extend(self, **cols) -> None:
        for c, v in cols.items():
            self.cols[c].extend(np.asarray(v).tolist())

    def write(self) -> None:
        if self.cols["time"]:
            self.table.extend(**self.cols)
            self.cols = {c: [] for c in self.cols}


def evaluate(table: ServerTable, env, episodes: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """(mean return, its std, mean length) of ``episodes`` greedy episodes of the server's table."""
    returns, lengths = [], []
    for _ in range(episodes):
        s, ret, n = env.reset(), 0.0, 0
        while True:
            s, r, terminated, truncated = env.step(table.greedy(s, rng))
            ret, n = ret + r, n + 1
            if terminated or truncated:
                break
        returns.append(ret)
        lengths.append(n)
    return float(np.mean(returns)), float(np.std(returns)), float(np.mean(lengths))


def run_server(ctx) -> str:
    cfg, d = ctx.cfg, ctx.cfg.distql
    comm = ctx.topo.learner
    workers = list(range(1, comm.size))
    S, A = ctx.spaces.n_states, ctx.spaces.n_actions
    table = ServerTable(S, A, d.server_eta, d.eta_decay)
    inbox = {w: np.empty(msg.exchange_nbytes(S * A, min(d.tau, d.episodes) + 1), np.uint8) for w in workers}
    outbox = {w: np.empty(msg.reply_nbytes(S * A), np.uint8) for w in workers}
    sends: dict[int, MPI.Request] = {}
    recvs = [comm.Irecv(inbox[w], source=w, tag=msg.EXCHANGE) for w in workers]
    eval_env = make_tabular_env(cfg.env, d.bins, seed=ctx.seed(2)) if d.eval_episodes else None
    eval_rng = np.random.default_rng(ctx.seed(3))
    f = MetricsFile(ctx.run_dir / "qserver.h5", {"role": "qserver", "rank": 0, "n_states": S, "n_actions": A,
                                                 "workers": len(workers), "mode": d.mode, "exchange": d.exchange,
                                                 "variant": d.variant, "tau": d.tau},
                    flush_seconds=cfg.log.flush_seconds)
    merges = Rows(f.table("merges", MERGES, UNITS))
    episodes = Rows(f.table("episodes", EPISODES, UNITS))
    stats = Rows(f.table("workers", WORKERS, UNITS))
    evals = Rows(f.table("eval", EVAL, UNITS))
    tables = (merges, episodes, stats, evals)
    done: set[int] = set()
    pending: dict[int, msg.Exchange] = {}  # sync: the round's exchanges that are in
    sizes: dict[int, int] = {}
    merged = 0
    stop_signal = None
    backoff = Backoff(first=20e-6, longest=2e-3)

    def record(w: int, ex: msg.Exchange) -> None:
        now = ctx.now()
        stats.add(time=now, worker=w, round=ex.round, episodes=ex.episodes_done, env_steps=ex.env_steps,
                  compute_s=ex.compute_s, wait_s=ex.wait_s, torch_imported=ex.torch_imported, bye=ex.bye)
        if len(ex.episode):
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
        if w in sends:
            sends.pop(w).Wait()  # long done: the worker has had that reply
        idx, q, eta = full if full is not None else (table.reply_all() if d.mode == "all"
                                                     else table.reply_partial(ex.idx))
        n = msg.pack_reply(outbox[w], ex.round, stop_signal is not None, idx, q, eta)
        sends[w] = comm.Isend(outbox[w][:n], dest=w, tag=msg.REPLY)
        merges.add(time=ctx.now(), worker=w, round=ex.round, pairs_in=len(ex.idx), new_pairs=new,
                   reply_pairs=len(idx), bytes_in=sizes[w], bytes_out=n, merge_s=merge_s)
        recvs[w - 1] = comm.Irecv(inbox[w], source=w, tag=msg.EXCHANGE)  # the bye, or the next round

    def maybe_eval() -> None:
        if eval_env is not None and d.eval_every and merged % d.eval_every == 0:
            mean, std, length = evaluate(table, eval_env, d.eval_episodes, eval_rng)
            evals.add(time=ctx.now(), merges=merged, return_mean=mean, return_std=std, length_mean=length,
                      episodes=d.eval_episodes)

    try:
        while len(done) < len(workers):
            if stop_signal is None and ctx.preempt is not None:
                notice = ctx.preempt.requested()
                if notice is not None:
                    stop_signal = notice
            arrived = MPI.Request.Testsome(recvs, statuses=None) or []
            if not arrived:
                _flush_due(f, tables)
                backoff.sleep()
                continue
            backoff.reset()
            for i in arrived:  # arrival order (within one test, rank order)
                w = workers[i]
                ex = msg.unpack_exchange(inbox[w])
                sizes[w] = msg.exchange_nbytes(len(ex.idx), len(ex.episode))
                record(w, ex)
                if ex.bye:
                    done.add(w)
                    continue
                if d.exchange == "async":
                    new, merge_s = merge(w, ex)
                    reply(w, ex, new, merge_s)
                    maybe_eval()
                else:
                    pending[w] = ex
            active = [w for w in workers if w not in done]
            if d.exchange == "sync" and active and len(pending) == len(active):
                rounds = {ex.round for ex in pending.values()}
                if len(rounds) != 1:
                    raise RuntimeError(f"sync exchange with workers at rounds {sorted(rounds)}")
                results = {w: merge(w, pending[w]) for w in sorted(pending)}  # rank order
                full = table.reply_all() if d.mode == "all" else None
                for w in sorted(pending):
                    reply(w, pending[w], *results[w], full=full)
                pending.clear()
                maybe_eval()
            _flush_due(f, tables)
        for req in sends.values():
            req.Wait()
        if eval_env is not None:
            mean, std, length = evaluate(table, eval_env, d.eval_episodes, eval_rng)
            evals.add(time=ctx.now(), merges=merged, return_mean=mean, return_std=std, length_mean=length,
                      episodes=d.eval_episodes)
        for rows in tables:
            rows.write()
        g = f.group("table")
        for name, arr in (("q", table.q), ("eta", table.eta), ("seen", table.seen), ("merges", table.merges)):
            g.create_dataset(name, data=arr, compression="gzip")
        if stop_signal is not None:
            rank, signum = stop_signal
            return (f"{STOPPED} by {signal_name(signum)} on rank {rank} after {merged} merges "
                    "(DistQL keeps no checkpoint; it cannot be resumed)")
        return f"{len(workers)} workers played {d.episodes} episodes each ({merged} merges)"
    finally:
        f.close()
        if eval_env is not None:
            eval_env.close()


def _flush_due(f: MetricsFile, tables) -> None:
    """Append the gathered rows and flush, every ``flush_seconds``."""
    if f.flush_due():
        for rows in tables:
            rows.write()
        f.flush()
