"""The server of the exchange family (rank 0; DistQL's Q-server): merges the workers' pairs into its table (the
algorithm's merge, :class:`~mpirl.exchange.builder.ServerTable`; DistQL Eq. 1) and answers each exchange with the
whole table (``mode = "all"``) or the pairs sent (``"partial"``). The settings named below are the algorithm's
section's (DistQL's), which the loop gets from its builder.

The workers' exchanges come through a :class:`~mpirl.comm.hub.Hub` (one pre-posted receive per worker).
``exchange = "async"``: each exchange is merged and answered as it arrives (the hub's ``"arrival"`` mode).
``"sync"``: the server waits until every worker still playing has sent its round k, merges them in rank order and
answers all (``"rounds"``); the workers meanwhile wait for their reply.

The run ends when every worker has played ``episodes``, or early: at a stop condition of ``[run]``
(``wall_seconds``, ``env_steps`` over all workers, ``target_return`` over the last ``return_window`` episodes) or
a signal on any rank (Ctrl-C through ``mpirl launch``, SIGUSR1, SIGTERM: then "preempted", exit 75). Either way
the stop flag rides in each worker's next reply together with the checkpoint flag: the last cut
(:mod:`mpirl.exchange.checkpoint`) is taken as the workers stop, and ``--resume`` continues from it, as from
the cuts taken every ``checkpoint.every_seconds``. A run whose workers all played their episodes ends with a last
cut too, of the server alone (each worker finished before it).

Everything lands in ``qserver.h5``: ``merges``, ``episodes`` and ``workers`` rows (the workers' counters and
finished episodes travel in their exchanges), ``eval`` rows (greedy episodes of the server's table, each cut at
``eval_max_steps``), and at the end the table itself (``table/q``, ``eta``, ``seen`` and per-pair
``merges``). A resumed run drops the rows after its checkpoint and appends.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import numpy as np
from mpi4py import MPI

from mpirl.comm.backoff import Backoff
from mpirl.comm.hub import Hub
from mpirl.exchange import messages as msg
from mpirl.exchange.builder import LINK, Environment, ExchangeBuilder, ServerTable
from mpirl.exchange.checkpoint import Cut, read_server
from mpirl.job.checkpoint import Resume, identity
from mpirl.job.context import RoleContext
from mpirl.job.run_control import RunControl
from mpirl.metrics.writer import MetricsFile, Rows

MERGES = {"time": np.float64, "worker": np.int32, "round": np.int64, "pairs_in": np.int64, "new_pairs": np.int64,
          "reply_pairs": np.int64, "bytes_in": np.int64, "bytes_out": np.int64, "merge_s": np.float64}
EPISODES = {"time": np.float64, "worker": np.int32, "episode": np.int64, "return": np.float64,
            "env_return": np.float64, "length": np.int64, "epsilon": np.float64}
WORKERS = {"time": np.float64, "worker": np.int32, "round": np.int64, "episodes": np.int64, "env_steps": np.int64,
           "compute_s": np.float64, "wait_s": np.float64, "torch_imported": np.bool_, "bye": np.bool_}
EVAL = {"time": np.float64, "merges": np.int64, "return_mean": np.float64, "return_std": np.float64,
        "length_mean": np.float64, "episodes": np.int64, "capped": np.int64}
UNITS = {"time": "s", "merge_s": "s", "compute_s": "s", "wait_s": "s", "bytes_in": "B", "bytes_out": "B"}


def evaluate(table: ServerTable, env: Environment, episodes: int, rng: np.random.Generator, max_steps: int) -> dict:
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


class Server:
    """The Q-server's loop: its table, hub and file, the workers' counters, the cut being taken (``cut``) and the
    stop once decided (``stop_reason``, '' until then)."""

    def __init__(self, ctx: RoleContext, builder: ExchangeBuilder) -> None:
        cfg = ctx.cfg
        self.ctx, self.cfg = ctx, cfg
        self.d = d = builder.settings(cfg)  # the family's settings: the algorithm's section
        self.comm = comm = ctx.topo.comm(LINK)
        self.workers = workers = list(range(1, comm.size))
        S, A = ctx.spaces.n_states, ctx.spaces.n_actions
        self.table = builder.make_server_table(cfg, ctx.spaces)
        self.state_in = np.empty(msg.state_nbytes(S * A), np.uint8)  # one worker's state at a time, during a cut
        self.eval_env = builder.make_env(cfg, ctx.seed(2)) if d.eval_episodes else None
        self.eval_rng = np.random.default_rng(ctx.seed(3))
        self.f = f = MetricsFile(ctx.run_dir / "qserver.h5",
                                 {"role": "qserver", "rank": 0, "n_states": S, "n_actions": A,
                                  "workers": len(workers), "mode": d.mode, "exchange": d.exchange,
                                  "variant": d.variant, "tau": d.tau},
                                 flush_seconds=cfg.log.flush_seconds, resume=bool(ctx.resume))
        self.merges = Rows(f.table("merges", MERGES, UNITS))
        self.episodes = Rows(f.table("episodes", EPISODES, UNITS))
        self.stats = Rows(f.table("workers", WORKERS, UNITS))
        self.evals = Rows(f.table("eval", EVAL, UNITS))
        self.tables = (self.merges, self.episodes, self.stats, self.evals)
        # The workers that said goodbye having played all their episodes (not stopped early).
        self.finished: set[int] = set()
        self.env_steps = dict.fromkeys(workers, 0)  # each worker's, as of its last exchange
        self.returns: deque = deque(maxlen=cfg.run.return_window)  # the last episodes' env returns, over all workers
        self.merged = 0
        if ctx.resume:
            self.restore(ctx.resume)
        # One pre-posted receive per worker still playing (the finished ones of a resumed run have said goodbye); an
        # exchange stays in its inbox until answered: while its round fills up (sync), or held during a cut.
        self.hub: Hub[msg.Exchange] = Hub(comm, workers, msg.EXCHANGE,
                                          msg.exchange_nbytes(S * A, min(d.tau, d.episodes) + 1), msg.REPLY,
                                          msg.reply_nbytes(S * A), finished=self.finished,
                                          mode="rounds" if d.exchange == "sync" else "arrival")
        self.sizes: dict[int, int] = {}
        self.cut: Cut | None = None
        self.state_recv = MPI.REQUEST_NULL
        self.stop_reason, self.stop_cut_due = "", False
        self.control = RunControl(ctx)  # its steps: the merges (a cut is named after them)
        if ctx.resume:
            self.control.saved(self.merged)
        self.status = MPI.Status()
        self.backoff = Backoff(first=20e-6, longest=2e-3)

    def restore(self, resume: Resume) -> None:
        """The table, counters and generators of the checkpoint; rows after it describe work done again."""
        saved = read_server(Path(resume.checkpoint))
        self.table.restore(saved["q"], saved["eta"], saved["seen"], saved["merges"])
        self.merged, self.finished = saved["merged"], set(saved["finished"])
        self.returns.extend(saved["returns"].tolist())
        self.env_steps.update({int(w): n for w, n in saved["server"]["env_steps"].items()})
        self.eval_rng.bit_generator.state = saved["server"]["eval_rng"]
        if self.eval_env is not None:
            self.eval_env.set_rng_state(saved["server"]["eval_env"])
        for rows in self.tables:
            rows.table.truncate(rows.table.rows_until("time", resume.job_time))

    def record(self, w: int, ex: msg.Exchange) -> None:
        """Worker ``w``'s counters and finished episodes, as its exchange ``ex`` brings them."""
        now = self.ctx.now()
        self.env_steps[w] = ex.env_steps
        self.stats.add(time=now, worker=w, round=ex.round, episodes=ex.episodes_done, env_steps=ex.env_steps,
                       compute_s=ex.compute_s, wait_s=ex.wait_s, torch_imported=ex.torch_imported, bye=ex.bye)
        if len(ex.episode):
            self.returns.extend(ex.env_ret.tolist())
            self.episodes.extend(time=np.full(len(ex.episode), now), worker=np.full(len(ex.episode), w),
                                 episode=ex.episode, **{"return": ex.ret}, env_return=ex.env_ret, length=ex.length,
                                 epsilon=ex.epsilon)

    def merge(self, ex: msg.Exchange) -> tuple[int, float]:
        """``ex``'s pairs merged into the table: the pairs new to it, the seconds taken."""
        start = time.perf_counter()
        new = self.table.merge(ex.idx, ex.q, ex.eta)
        self.merged += 1
        return new, time.perf_counter() - start

    def reply(self, w: int, ex: msg.Exchange, new: int, merge_s: float, full=None) -> None:
        """Answer ``w``'s exchange ``ex`` (``full``: the whole table, read once for a round's replies)."""
        table, cut = self.table, self.cut
        out = self.hub.outbox(w)
        idx, q, eta = full if full is not None else (table.reply_all() if self.d.mode == "all"
                                                     else table.reply_partial(ex.idx))
        joins = cut is not None and cut.join(w)  # this reply takes the worker into the cut
        n = msg.pack_reply(out, ex.round, cut is not None and joins and cut.stop, idx, q, eta, checkpoint=joins)
        self.hub.reply(w, n)  # and the receive of the bye, or the next round
        self.merges.add(time=self.ctx.now(), worker=w, round=ex.round, pairs_in=len(ex.idx), new_pairs=new,
                        reply_pairs=len(idx), bytes_in=self.sizes[w], bytes_out=n, merge_s=merge_s)

    def evaluate_now(self) -> None:
        """An evaluation's row (the server evaluates only with an environment to evaluate on)."""
        d = self.d
        assert self.eval_env is not None
        self.evals.add(time=self.ctx.now(), merges=self.merged,
                       **evaluate(self.table, self.eval_env, d.eval_episodes, self.eval_rng, d.eval_max_steps))

    def handle(self, w: int) -> None:
        """The exchange in worker ``w``'s inbox: just arrived, or released from hold after a cut."""
        d, hub, cut = self.d, self.hub, self.cut
        ex = msg.unpack_exchange(hub.inbox(w))
        if not ex.bye and cut is not None and w in cut.members:
            hub.hold(w)  # its next round: after the cut's commit
            return
        self.sizes[w] = msg.exchange_nbytes(len(ex.idx), len(ex.episode))
        self.record(w, ex)
        if ex.bye:
            hub.finish(w)
            if ex.episodes_done >= d.episodes:
                self.finished.add(w)
        elif d.exchange == "async":
            self.reply(w, ex, *self.merge(ex))
            if self.eval_env is not None and d.eval_every and self.merged % d.eval_every == 0:
                self.evaluate_now()
        else:
            hub.join(w, ex)

    def close_round(self) -> None:
        """sync: once every worker still playing has sent round k, merge them in rank order and answer all."""
        d = self.d
        exchanges = self.hub.round()
        if exchanges is None:
            return
        rounds = {ex.round for ex in exchanges.values()}
        if len(rounds) != 1:
            raise RuntimeError(f"sync exchange with workers at rounds {sorted(rounds)}")
        results = {w: self.merge(ex) for w, ex in exchanges.items()}  # rank order
        full = self.table.reply_all() if d.mode == "all" else None
        for w, ex in exchanges.items():
            self.reply(w, ex, *results[w], full=full)
        after, before = self.merged, self.merged - len(results)
        if self.eval_env is not None and d.eval_every and after // d.eval_every > before // d.eval_every:
            self.evaluate_now()

    def write(self) -> None:
        for rows in self.tables:
            rows.write()

    def flush_due(self) -> None:
        """Append the gathered rows and flush, every ``flush_seconds``."""
        if self.f.flush_due():
            self.write()
            self.f.flush()

    def commit(self, done: Cut) -> None:
        """Every row so far on disk, then the checkpoint ``done`` (its job time after all of them)."""
        self.write()
        self.f.flush()
        eval_env = self.eval_env
        server = {"env_steps": self.env_steps, "eval_rng": self.eval_rng.bit_generator.state,
                  "eval_env": eval_env.rng_state() if eval_env is not None else ""}
        done.commit(self.table, self.merged, self.finished, self.ctx.now(), identity(self.cfg, self.comm.size),
                    server, list(self.returns), self.cfg.checkpoint.keep)
        self.control.saved(self.merged)

    def begin_cut(self, stop: bool) -> None:
        self.cut = Cut(self.ctx.run_dir, set(self.hub.live), stop=stop)
        self.state_recv = self.comm.Irecv(self.state_in, source=MPI.ANY_SOURCE, tag=msg.STATE)
        self.stop_cut_due = False

    def take_state(self) -> bool:
        """A worker's state for the cut, if one has come (True then)."""
        if self.cut is None or not self.state_recv.Test(self.status):
            return False
        self.cut.add_state(self.status.Get_source(), msg.unpack_state(self.state_in))
        self.state_recv = self.comm.Irecv(self.state_in, source=MPI.ANY_SOURCE, tag=msg.STATE)
        return True

    def end_cut(self, done: Cut) -> None:
        """The complete cut ``done`` committed; a stop that came during it gets a cut of its own, the held
        exchanges first in it; the held exchanges handled."""
        self.state_recv.Cancel()
        self.state_recv.Wait()
        self.commit(done)
        self.cut = None
        if self.stop_cut_due:
            self.begin_cut(True)
        for w in self.hub.release():
            self.handle(w)
        self.close_round()

    def step(self) -> None:
        """One turn: the stop asked, a cut begun when one is due, a worker's state taken into it, the exchanges that
        arrived handled, the cut committed once complete, the rows flushed when due; back off when nothing came."""
        control = self.control
        if not self.stop_reason:
            self.stop_reason = control.stop_reason(env_steps=sum(self.env_steps.values()), returns=self.returns)
            self.stop_cut_due = bool(self.stop_reason)
        due = not self.stop_reason and control.checkpoint_due(self.merged)
        if self.cut is None and (self.stop_cut_due or due):
            self.begin_cut(self.stop_cut_due)
        busy = self.take_state()
        arrived = self.hub.poll()
        for w in arrived:  # arrival order (within one test, rank order)
            self.handle(w)
        self.close_round()
        if self.cut is not None and self.cut.complete(self.hub.done):
            self.end_cut(self.cut)
            busy = True
        self.flush_due()
        if arrived or busy:
            self.backoff.reset()
        else:
            self.backoff.sleep()

    def run(self) -> str:
        """Until every worker has said goodbye and no cut is open; then the last evaluation and the table."""
        try:
            while not self.hub.finished or self.cut is not None:
                self.step()
            if not self.stop_reason:  # every worker played its episodes: the last cut holds the server alone
                self.cut = Cut(self.ctx.run_dir, set(), stop=True)
                self.commit(self.cut)
                self.cut = None
            self.hub.close()
            if self.eval_env is not None:
                self.evaluate_now()
            self.write()
            g = self.f.group("table")
            table = self.table
            for name, arr in (("q", table.q), ("eta", table.eta), ("seen", table.seen), ("merges", table.merges)):
                g.create_dataset(name, data=arr, compression="gzip")
            return self.stop_reason or (f"{len(self.workers)} workers played {self.d.episodes} episodes each "
                                        f"({self.merged} merges)")
        finally:
            if self.cut is not None:  # a failure mid-cut: nothing that looks like a checkpoint stays
                self.cut.abandon()
            self.f.close()
            if self.eval_env is not None:
                self.eval_env.close()


def run_server(ctx: RoleContext, builder: ExchangeBuilder) -> str:
    return Server(ctx, builder).run()

