"""A worker of the gradient family: plays its own games with its own copy of the actor-critic, computes the
gradients of its rollouts and exchanges them (:mod:`mpirl.gradients.exchange`).

Its loop reads top to bottom: a rollout of ``unroll`` steps (the family's settings) of its ``env.envs_per_actor``
games (under ``allreduce`` ended early when DD-PPO's straggler rule says so), its advantages, then each gradient the
builder's passes ask for is sent and the parameters that come back (or the average every peer applies) replace the
worker's. The stop comes in a reply (server) or from the peers' shared progress (allreduce).

Its file ``worker_<rank>.h5``: ``rollouts`` (one row a rollout: steps, preempted, env steps, version, the seconds
computing and waiting for the exchange, gradients sent and dropped) and ``episodes`` (return, length).
"""

from __future__ import annotations

import time
import zlib

import numpy as np
import torch

from mpirl.agents.schedules import progress_of
from mpirl.envs.delay import Delay
from mpirl.envs.games import VectorGames
from mpirl.gradients.builder import GradientBuilder, GradientModel, GradientRollout
from mpirl.gradients.exchange import exchange_for
from mpirl.metrics.writer import MetricsFile, Rows

F8, I8 = np.float64, np.int64
ROLLOUTS = {"time": F8, "rollout": I8, "steps": I8, "preempted": np.bool_, "env_steps": I8, "version": I8,
            "compute_s": F8, "wait_s": F8, "gradients": I8, "dropped": I8, "env_errors": I8}
EPISODES = {"time": F8, "episode": I8, "return": F8, "length": I8}
UNITS = {"time": "s", "compute_s": "s", "wait_s": "s"}


class Games:
    """The worker's games (the shared single-agent :class:`~mpirl.envs.games.VectorGames`: forced FIRE after a
    lost life, a lost life cutting the return where ``env.terminal_on_life_loss`` says so, the games rebuilt when
    one raises) and its episodes' bookkeeping."""

    def __init__(self, ctx, delay_s: float, reward_scale: float):
        cfg = ctx.cfg
        self.games = VectorGames(cfg, ctx.spaces, ctx.seed(), f"worker rank {ctx.topo.rank}")
        self.obs = self.games.start().rows["obs"].copy()
        E = cfg.env.envs_per_actor
        self.ret, self.length = np.zeros(E), np.zeros(E, np.int64)
        self.clip, self.scale = cfg.agent.reward_clip, reward_scale
        self.delay = Delay(delay_s)
        self.finished: list[tuple[float, int]] = []  # (return, length) since they were last taken
        self.starts = np.ones(E, bool)  # the games whose next observation begins an episode (a recurrent core resets)

    @property
    def env_errors(self) -> int:
        return self.games.env_errors

    def play(self, model: GradientModel, ro: GradientRollout, rng: np.random.Generator, stop_early) -> bool:
        """Fill ``ro``; True when ``stop_early(steps)`` ended it before ``ro.T`` steps."""
        preempted = False
        t = 0
        model.begin(ro)
        for t in range(ro.T):
            if stop_early(t):
                preempted = True
                break
            obs = model.observe(self.obs)  # counted for the job's statistics and normalised (when they are on)
            if ro.first is not None:
                ro.first[t] = self.starts
            actions, logp, values = model.act(obs, rng, self.starts)
            self.starts = np.zeros_like(self.starts)
            out = self.games.step(actions)
            if self.delay.seconds:
                self.delay.step()
            o = out.rows
            ro.obs[t], ro.action[t], ro.logp[t], ro.value[t] = obs, actions, logp, values
            ro.final_value[t] = 0.0
            if out.fresh:  # the games failed and were rebuilt: the step is cut there (no reward), each game's
                ro.reward[t] = 0.0  # return bootstrapped from its value, their unfinished episodes dropped
                ro.terminated[t], ro.truncated[t] = False, True
                ro.final_value[t] = values
                self.ret[:], self.length[:] = 0.0, 0
                model.restart()
                self.obs = o["obs"].copy()
                self.starts = np.ones_like(self.starts)
                continue
            if not np.array_equal(o["taken"], actions):  # a forced FIRE was played: the rollout holds it
                ro.action[t], ro.logp[t] = o["taken"], model.log_prob(obs, o["taken"])
            reward = o["reward"] if not self.clip else np.clip(o["reward"], -self.clip, self.clip)
            cut = o["terminated"] | o["life_lost"]  # a lost life ends the return where the env says so
            ended = o["terminated"] | o["truncated"]
            ro.reward[t] = model.rewards(reward, ended) * self.scale
            ro.terminated[t], ro.truncated[t] = cut, o["truncated"] & ~cut
            trunc = ro.truncated[t]
            if trunc.any():
                ro.final_value[t][trunc] = model.values(model.normalize(o["final_obs"][trunc]), rows=trunc)
            self.ret += o["reward"]
            self.length += 1
            for e in np.flatnonzero(ended):
                self.finished.append((float(self.ret[e]), int(self.length[e])))
                self.ret[e], self.length[e] = 0.0, 0
            self.obs = o["obs"].copy()
            self.starts = ended.copy()
        else:
            t = ro.T
        ro.steps = t
        ro.bootstrap[:] = model.values(model.normalize(self.obs), starts=self.starts)
        return preempted

    def take(self) -> list[tuple[float, int]]:
        out, self.finished = self.finished, []
        return out

    def close(self) -> None:
        self.games.close()


class Worker:
    """The worker's loop: its model, link (:func:`~mpirl.gradients.exchange.exchange_for`), games and file, its
    counters, and the stop once it comes (``stop``, '' until then)."""

    def __init__(self, ctx, builder: GradientBuilder) -> None:
        cfg, a = ctx.cfg, builder.settings(ctx.cfg)
        torch.set_num_threads(cfg.agent.torch_threads)
        self.ctx, self.cfg, self.a, self.builder = ctx, cfg, a, builder
        self.model = model = builder.make_model(ctx, optimizer=a.exchange == "allreduce")
        self.link = exchange_for(ctx, builder, model)
        self.me = me = self.link.index  # among the workers
        delays = a.worker_delay_us
        self.games = Games(ctx, 1e-6 * delays[me if len(delays) > 1 else 0], a.reward_scale)
        self.rng = np.random.default_rng(ctx.seed(1))
        self.E, T = cfg.env.envs_per_actor, a.unroll
        self.ro = builder.make_rollout(ctx)
        self.grad = np.zeros(model.n_params, np.float32)
        self.shortest = a.min_steps
        self.f = MetricsFile(ctx.run_dir / f"worker_{ctx.topo.rank}.h5",
                             {"role": "worker", "rank": ctx.topo.rank, "worker": me, "exchange": a.exchange,
                              "loss": a.loss, "n_params": model.n_params, "unroll": T, "envs": self.E,
                              "device": str(model.device)},
                             flush_seconds=cfg.log.flush_seconds, resume=bool(ctx.resume))
        self.rollouts = Rows(self.f.table("rollouts", ROLLOUTS, UNITS))
        self.episodes = Rows(self.f.table("episodes", EPISODES, UNITS))
        if ctx.resume:
            for rows in (self.rollouts, self.episodes):
                rows.table.truncate(rows.table.rows_until("time", ctx.resume.job_time))
        self.env_steps = self.n_episodes = 0  # the job's, from link.start()
        self.n_rollouts = self.sent = self.dropped = 0
        self.compute_s = self.wait_s = 0.0
        self.mark = time.perf_counter()  # where the seconds counted last ended
        self.stop = ""

    def lap(self) -> float:
        """Seconds since the last lap (or the rollout's start)."""
        now = time.perf_counter()
        seconds, self.mark = now - self.mark, now
        return seconds

    def step(self) -> None:
        """One rollout: played, its episodes written, its gradients exchanged (under ``allreduce`` then the shared
        stop decision), its row."""
        ctx, link = self.ctx, self.link
        if ctx.preempt is not None:
            ctx.preempt.requested()  # a signal here: tell rank 0 (the server, or worker 0), which stops the job
        self.mark = time.perf_counter()
        preempted = self.games.play(self.model, self.ro, self.rng,
                                    lambda t: t >= self.shortest and link.preempt(self.n_rollouts, t))
        link.finished_rollout(self.n_rollouts)
        self.n_rollouts += 1
        self.env_steps += self.ro.steps * self.E
        rets, lens = self.finished_episodes()
        self.send_gradients(rets, lens)
        if not self.stop:
            self.compute_s += self.lap()
            self.stop = link.end_rollout(self.env_steps, self.n_episodes, rets, lens)
            self.wait_s += self.lap()
        self.compute_s += self.lap()
        self.rollouts.add(time=ctx.now(), rollout=self.n_rollouts, steps=self.ro.steps, preempted=preempted,
                          env_steps=self.env_steps, version=link.version, compute_s=self.compute_s,
                          wait_s=self.wait_s, gradients=self.sent, dropped=self.dropped,
                          env_errors=self.games.env_errors)
        if self.f.flush_due():
            self.write()
            self.f.flush()

    def finished_episodes(self) -> tuple[np.ndarray, np.ndarray]:
        """The episodes the rollout finished, written to ``episodes``: their returns and lengths."""
        done = self.games.take()
        self.n_episodes += len(done)
        if not done:
            return np.zeros(0), np.zeros(0, np.int64)
        rets, lens = np.array([d[0] for d in done]), np.array([d[1] for d in done], np.int64)
        self.episodes.extend(time=np.full(len(done), self.ctx.now()),
                             episode=np.arange(self.n_episodes - len(done), self.n_episodes),
                             **{"return": rets}, length=lens)
        return rets, lens

    def send_gradients(self, rets: np.ndarray, lens: np.ndarray) -> None:
        """Each gradient the loss asks for of the rollout, sent (the episodes ``rets``, ``lens`` with the first),
        and the parameters that come back taken; a stop that comes back ends it."""
        cfg, link, model = self.cfg, self.link, self.model
        model.at(progress_of(cfg, *link.job_steps(self.env_steps)))  # the loss's scheduled coefficients
        prepared = model.prepare(self.ro)
        for parts in self.builder.passes(cfg, prepared.n, self.rng):
            for idx in parts:
                if link.lockstep and cfg.run.train_steps and link.version >= cfg.run.train_steps:
                    break  # every rank at the same version: all stop updating here, none past the limit
                stats = model.gradient(prepared, idx, self.grad)
                if stats is None:
                    raise RuntimeError(f"worker {self.me} (rank {self.ctx.topo.rank}): {model.fault}; the settings "
                                       f"that feed it: agent.lr={cfg.agent.lr:g}, agent.grad_clip="
                                       f"{cfg.agent.grad_clip:g}, agent.reward_clip={cfg.agent.reward_clip:g}")
                self.compute_s += self.lap()
                out = link.update(self.grad, stats, self.n_rollouts, self.env_steps, self.n_episodes, rets, lens)
                rets, lens = rets[:0], lens[:0]  # the episodes travel once
                self.wait_s += self.lap()
                self.sent += 1
                self.dropped += out.dropped
                if out.stop:
                    self.stop = out.stop
                    return

    def write(self) -> None:
        for rows in (self.rollouts, self.episodes):
            rows.write()

    def run(self) -> str:
        """Rollouts until the stop; then the link's end and the file's last attributes."""
        link = self.link
        # The parameters (and, resumed, this worker's counters) of the job; a job that has already stopped (its
        # other workers reached the stop before this one said hello) stops this worker before its first rollout.
        self.env_steps, self.n_episodes, self.stop = link.start()
        # When this worker's games began, on the job clock (what a throughput figure counts from: mpirl.bench.atari).
        self.f.set_attrs(started_s=self.ctx.now())
        try:
            while not self.stop:
                self.step()
            link.finish()
            self.f.set_attrs(version=link.version, params_crc32=zlib.crc32(self.model.flat_params().tobytes()))
            link.close()  # collective under allreduce: only on the way every rank takes (a failure aborts the job)
            return self.stop
        finally:
            self.games.close()
            self.write()
            self.f.close()


def run_worker(ctx, builder: GradientBuilder) -> str:
    return Worker(ctx, builder).run()
