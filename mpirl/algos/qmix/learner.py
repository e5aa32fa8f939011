"""The QMIX learner: the shared learner loop (requests, replies, parameter broadcasts, checkpoints, stop
conditions; :mod:`mpirl.roles.replay_learner`) over batches of whole episodes.

*proposed*: each buffer samples its share of episodes (uniform, or AccMER's reuse set plus uniform
picks) and the next request carries the sampled episodes' new weights. *baseline*: the learner keeps
the episode replay and its sampler itself, refreshed wholesale from the buffers every
``replay.n_replay`` train steps; the AccMER reuse block then stays in the learner's batch arrays for
its window. A train step is :meth:`mpirl.agents.qmix.QMixLearner.train_step`; MAC-PO's weights come
with ``qmix.loss_weights = "macpo"``.

Every ``qmix.test_every`` train steps and at the stop the learner plays ``qmix.test_episodes`` greedy
episodes (epsilon 0) on games of its own and writes them to the ``test`` table.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from mpirl.agents.dqn import pick_device
from mpirl.agents.qmix import QmixHyper, QMixLearner, divergence
from mpirl.agents.qmix_policy import QMixPolicy
from mpirl.roles.replay_learner import MAX_SKIPPED_IN_A_ROW, Learner
from mpirl.algos.qmix.envs import make
from mpirl.metrics.writer import MetricsFile
from mpirl.replay.episode_shard import EpisodeShard
from mpirl.roles import checkpoint
from mpirl.roles.context import Interval, RoleContext

F8, I8 = np.float64, np.int64
STATS = ("loss", "td_abs", "q_tot", "central_loss", "w_mean_raw", "f_mean", "grad_norm")


def episode_stats(game) -> dict:
    """The finished episode's counters where the environment keeps them (predator-prey: captures and lone
    catches), else {}."""
    inner = getattr(game, "env", None)
    stats = getattr(inner, "episode_stats", None)
    return dict(stats()) if callable(stats) else {}


class QmixLearner(Learner):
    def make_agent(self):
        cfg, s = self.cfg, self.ctx.spaces
        q, a = cfg.qmix, cfg.agent
        hp = QmixHyper(gamma=a.gamma, td_lambda=q.td_lambda, lr=a.lr, grad_clip=a.grad_clip,
                       target_update=a.target_update, rnn_hidden=q.rnn_hidden, mixer_embed=q.mixer_embed,
                       hypernet_hidden=q.hypernet_hidden, loss_weights=q.loss_weights,
                       central_hidden=q.central_hidden)
        agent = QMixLearner(s.n_agents, s.obs_shape, s.state_shape, s.n_actions, hp,
                            device=pick_device(a.device), seed=cfg.run.seed)
        agent.precision = "fp32"
        return agent

    # -- checkpoints ---------------------------------------------------------------
    def _state(self) -> dict:
        return {"identity": checkpoint.identity(self.cfg, self.ctx.topo.world.size),
                "train_steps": self.agent.steps, "job_time": self.ctx.now(),
                "learner_seconds": time.perf_counter() - self.started, "agent": self.agent.state_dict(),
                "torch_rng": torch.get_rng_state(), "numpy_rng": self.rng.bit_generator.state,
                "version": self.version, "episodes": self.episodes, "returns": list(self.returns),
                "env_steps": list(self.env_steps), "consumed": list(self.consumed), "skipped": self.skipped,
                "clock": [self.clock.compute, self.clock.comm], "link_bytes": self.link_bytes(),
                "timers": [self.sample_s, self.train_s, self.test_s]}

    def _restore(self, st: dict) -> None:
        self.agent.load_state_dict(st["agent"])
        torch.set_rng_state(st["torch_rng"].cpu())
        self.rng.bit_generator.state = st["numpy_rng"]
        self.version, self.episodes = int(st["version"]), int(st["episodes"])
        self.returns.extend(st["returns"])
        self.env_steps, self.consumed = list(st["env_steps"]), list(st["consumed"])
        self.skipped = int(st["skipped"])
        self.clock.compute, self.clock.comm = st["clock"]
        self.bytes_base = dict(st["link_bytes"])
        self.sample_s, self.train_s, self.test_s = st["timers"]
        self.started = time.perf_counter() - float(st["learner_seconds"])

    # -- metrics -------------------------------------------------------------------
    def _open_metrics(self) -> None:
        ctx, cfg = self.ctx, self.cfg
        if not hasattr(self, "sample_s"):
            self.sample_s = self.train_s = self.test_s = 0.0
        s = ctx.spaces
        self.file = MetricsFile(ctx.run_dir / "learner.h5", flush_seconds=cfg.log.flush_seconds,
                                attrs={"role": "learner", "rank": 0, "algorithm": "qmix",
                                       "architecture": cfg.replay.architecture, "sampler": cfg.replay.sampler,
                                       "loss_weights": cfg.qmix.loss_weights, "env_id": cfg.env.id,
                                       "n_agents": s.n_agents, "n_actions": s.n_actions,
                                       "episode_limit": s.episode_limit, "device": str(self.agent.device),
                                       "torch_threads": self.threads, "n_params": self.agent.n_params,
                                       "batch_size": cfg.replay.batch_size}, resume=bool(ctx.resume))
        self.table = self.file.table("train", {
            "time": F8, "train_steps": I8, "env_steps": I8, **{k: F8 for k in STATS}, "p_t": F8,
            "train_steps_per_s": F8, "compute_s": F8, "comm_s": F8, "sample_s": F8, "train_s": F8, "test_s": F8,
            "bytes_in": I8, "bytes_in_raw": I8, "bytes_out": I8, "bytes_out_raw": I8, "samples_trained": I8,
            "return_mean20": F8, "episodes": I8, "param_version": I8, "skipped_batches": I8})
        self.shard_table = self.file.table("shards", {
            "time": F8, "buffer": I8, "quota": I8, "size": I8, "inserted_per_s": F8, "consumed": I8})
        self.test_table = self.file.table("test", {
            "time": F8, "train_steps": I8, "env_steps": I8, "return_mean": F8, "return_std": F8,
            "captures": F8, "lone_catches": F8, "length": F8, "episodes": I8})
        if ctx.resume:
            for table in (self.table, self.shard_table, self.test_table):
                table.truncate(table.rows_until("time", ctx.resume.job_time))
        self.tick = Interval(cfg.log.interval)
        self.acc = {k: [] for k in (*STATS, "p_t")}
        self.last_p_t = math.nan
        self.per_batch = {}
        self.last_row, self.last_t = (self.agent.steps, self.skipped), time.perf_counter()
        self.tested_at = -1
        self.test_games = None

    def log(self, force: bool = False) -> None:
        if not (self.tick.due() or force):
            self.file.flush_if_due()
            return
        now = time.perf_counter()
        if (self.agent.steps, self.skipped) == self.last_row:
            self.file.flush_if_due()
            return
        mean = {k: float(np.nanmean(v)) if v and not np.isnan(v).all() else math.nan for k, v in self.acc.items()}
        self.table.append(
            time=self.ctx.now(), train_steps=self.agent.steps, env_steps=sum(self.env_steps),
            train_steps_per_s=(self.agent.steps - self.last_row[0]) / max(now - self.last_t, 1e-9),
            compute_s=self.clock.compute, comm_s=self.clock.comm, sample_s=self.sample_s, train_s=self.train_s,
            test_s=self.test_s, **self.link_bytes(), samples_trained=self.agent.steps * self.cfg.replay.batch_size,
            return_mean20=float(np.mean(self.returns)) if self.returns else math.nan,
            episodes=self.episodes, param_version=self.version, skipped_batches=self.skipped, **mean)
        self.last_row, self.last_t = (self.agent.steps, self.skipped), now
        n = len(self.sizes)
        self.shard_table.extend(time=np.full(n, self.ctx.now()), buffer=np.array(self.ctx.topo.buffers),
                                quota=np.array(self.quotas), size=np.array(self.sizes),
                                inserted_per_s=np.array([m.rate for m in self.meters]),
                                consumed=np.array(self.consumed))
        for v in self.acc.values():
            v.clear()
        self.file.flush_if_due()

    # -- training --------------------------------------------------------------------
    def replies_ready(self) -> bool:
        t = time.perf_counter()
        ready = super().replies_ready()
        self.sample_s += time.perf_counter() - t  # proposed: getting a batch is waiting for the buffers' replies
        return ready

    def train(self, batch: dict, probs: np.ndarray, n_total: int, sampled_priority: np.ndarray) -> np.ndarray:
        """One train step on whole episodes; returns the episodes' new weights (AccMER's table, sent back)."""
        t = time.perf_counter()
        stats = self.agent.train_step(batch)
        self.train_s += time.perf_counter() - t
        if stats["skipped"]:  # non-finite loss or gradient: skipped, counted, the episodes keep their weights
            self.skipped += 1
            self.skipped_in_a_row += 1
            if self.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
                raise FloatingPointError(divergence(self.agent.fault, self.agent.hp, self.skipped_in_a_row,
                                                    self.agent.steps, self.skipped))
            return np.asarray(sampled_priority, dtype=np.float32)
        self.skipped_in_a_row = 0
        for k in STATS:
            self.acc[k].append(stats[k])
        self.after_step()
        weights = stats["episode_weights"].astype(np.float32)
        bad = ~np.isfinite(weights)
        if bad.any():  # a weight the sampler cannot rank: those episodes keep the weights they had
            weights[bad] = np.asarray(sampled_priority, dtype=np.float32)[bad]
        return weights

    def after_step(self) -> None:
        q = self.cfg.qmix
        if self.agent.steps % q.test_every == 0 and self.agent.steps != self.tested_at:
            self.test()

    def run_baseline(self) -> None:
        cfg, clock = self.cfg, self.clock
        rp = cfg.replay
        local = EpisodeShard(self.ctx.spec, rp.capacity * len(self.links), rp.sampler, rp.batch_size,
                             rp.accmer_alpha, rp.accmer_discount)
        batch = local.episodes.batch_arrays(rp.batch_size)
        need = max(rp.learning_starts, rp.batch_size)
        next_try = 0.0
        while not self.should_stop():
            self.pump()
            self.serve()
            if local.size < need and time.perf_counter() < next_try:
                self.log()
                self.idle(0.01)  # waiting for the buffers to fill
                continue
            if self.agent.steps % rp.n_replay == 0 or local.size < need:
                self.refresh(local)
                if local.size < need:
                    rate = np.nansum([m.rate for m in self.meters])
                    wait = (need - local.size) / rate if rate > 0 else 0.2
                    next_try = time.perf_counter() + min(max(wait, 0.05), 5.0)
                    continue
            with clock.computing():
                t = time.perf_counter()
                picks = local.sample_batch(rp.batch_size, self.rng, batch)
                self.sample_s += time.perf_counter() - t
                weights = self.train(batch, None, local.size, local.sampler.weights_of(picks.ids))
                local.update_priorities(picks.ids, picks.versions, weights)
            self.publish_due()
            self.checkpoint_due()
            self.log()

    # -- greedy test episodes ------------------------------------------------------
    def test(self) -> None:
        """``qmix.test_episodes`` greedy episodes of the current agent network, one game each, in lockstep."""
        t0 = time.perf_counter()
        self.tested_at = self.agent.steps
        cfg, s = self.cfg, self.ctx.spaces
        n = cfg.qmix.test_episodes
        if self.test_games is None:
            seed = int(np.random.SeedSequence([cfg.run.seed, 99991]).generate_state(1)[0])
            self.test_games = [make(cfg, seed + k, s) for k in range(n)]
            self.test_policy = QMixPolicy(s.n_agents, s.obs_shape, s.n_actions, cfg.qmix.rnn_hidden)
            self.test_seed = seed
        policy = self.test_policy
        policy.load_flat(self.agent.flat_params())
        policy.reset(n)
        obs = np.zeros((n, s.n_agents, *s.obs_shape), s.obs_dtype)
        avail = np.zeros((n, s.n_agents, s.n_actions), bool)
        for k, game in enumerate(self.test_games):  # fresh seeds every round: different episodes each time
            obs[k], avail[k], _ = game.reset(seed=self.test_seed + 1000 * self.agent.steps + k)
        returns, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
        captures, lone = np.full(n, np.nan), np.full(n, np.nan)
        live = np.ones(n, bool)
        while live.any():
            actions = policy.act(obs, avail, 0.0, self.rng, greedy=True)
            for k in np.flatnonzero(live):
                out = self.test_games[k].step(actions[k])
                returns[k] += out.reward
                lengths[k] += 1
                obs[k], avail[k] = out.obs, out.mask
                if out.terminated or out.truncated or lengths[k] >= s.episode_limit:
                    live[k] = False
                    stats = episode_stats(self.test_games[k])
                    captures[k], lone[k] = stats.get("captures", np.nan), stats.get("lone_catches", np.nan)
        self.test_table.append(time=self.ctx.now(), train_steps=self.agent.steps, env_steps=sum(self.env_steps),
                               return_mean=float(returns.mean()), return_std=float(returns.std()),
                               captures=float(np.nanmean(captures)) if np.isfinite(captures).any() else math.nan,
                               lone_catches=float(np.nanmean(lone)) if np.isfinite(lone).any() else math.nan,
                               length=float(lengths.mean()), episodes=n)
        self.test_s += time.perf_counter() - t0

    def shutdown(self) -> None:
        if self.agent.steps != self.tested_at:
            self.test()  # the final policy's greedy return: the number a run is judged by
        for game in self.test_games or []:
            game.close()
        super().shutdown()


def run_learner(ctx: RoleContext) -> str:
    return QmixLearner(ctx).run()
