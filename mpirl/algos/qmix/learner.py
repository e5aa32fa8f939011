"""The QMIX learner: the one learner loop (requests, replies, parameter broadcasts, checkpoints, stop
conditions; :mod:`mpirl.actor_learner.learner`) over batches of whole episodes.

From remote shards, each buffer samples its share of episodes (uniform, or AccMER's reuse set plus
uniform picks) and the next request carries the sampled episodes' new weights. From a local memory, the
learner keeps the episode replay and its sampler itself (:class:`LocalEpisodes`), refreshed wholesale from
the buffers every ``replay.n_replay`` train steps; the AccMER reuse block then stays in the learner's batch
arrays for its window. A train step is :meth:`mpirl.agents.qmix_learner.QMixLearner.train_step`; MAC-PO's weights come
with ``qmix.loss_weights = "macpo"``.

Every ``qmix.test_every`` train steps and at the stop the learner plays ``qmix.test_episodes`` greedy
episodes (epsilon 0) on games of its own and writes them to the ``test`` table.
"""

from __future__ import annotations

import math
import time

import numpy as np

from mpirl.agents.tensors import pick_device
from mpirl.agents.qmix import QmixHyper, divergence
from mpirl.agents.qmix_learner import QMixLearner
from mpirl.agents.qmix_policy import QMixPolicy
from mpirl.algos.qmix.envs import make
from mpirl.metrics.writer import MetricsFile
from mpirl.replay.episode_shard import EpisodeShard
from mpirl.job.context import RoleContext
from mpirl.actor_learner.batch_sources import Batch
from mpirl.actor_learner.learner_algorithm import LearnerAlgorithm
from mpirl.actor_learner.counters import Counters
from mpirl.actor_learner.learner_peers import LearnerPeers

F8, I8 = np.float64, np.int64
STATS = ("loss", "td_abs", "q_tot", "central_loss", "w_mean_raw", "f_mean", "grad_norm")


def episode_stats(game) -> dict:
    """The finished episode's counters where the environment keeps them (predator-prey: captures and lone
    catches), else {}."""
    inner = getattr(game, "env", None)
    stats = getattr(inner, "episode_stats", None)
    return dict(stats()) if callable(stats) else {}


class LocalEpisodes:
    """The learner's own episode replay and its sampler, filled from the buffers' dumps; the AccMER reuse block
    stays in the batch arrays for its window."""

    def __init__(self, ctx: RoleContext, capacity: int, rows: int):
        rp = ctx.cfg.replay
        q = ctx.cfg.qmix
        self.shard = EpisodeShard(ctx.spec, capacity, q.sampler, rows, q.accmer_alpha, q.accmer_discount)
        self.batch_size = rows  # the batch, or this learner's part of it (K data-parallel learners)
        self.need = max(rp.learning_starts, rp.batch_size)
        self.out = self.shard.episodes.batch_arrays(rows)

    @property
    def size(self) -> int:
        return self.shard.size

    def clear(self) -> None:
        self.shard.clear()

    def add_dump(self, views: dict[str, np.ndarray], values: np.ndarray) -> None:
        self.shard.add(views, values)

    def sample(self, rng: np.random.Generator) -> Batch:
        picks = self.shard.sample_batch(self.batch_size, rng, self.out)
        return Batch(self.out, self.shard.sampler.weights_of(picks.ids), None, self.shard.size, origin=picks)

    def give_back(self, batch: Batch, values: np.ndarray) -> None:
        self.shard.update_priorities(batch.origin.ids, batch.origin.versions, values)


class QmixTraining(LearnerAlgorithm):
    """QMIX's side of the learner loop: the agent network and mixers, the train step on whole episodes, greedy tests."""

    agent: QMixLearner

    def __init__(self, ctx: RoleContext, rng: np.random.Generator, counters: Counters,
                 peers: LearnerPeers | None = None):
        super().__init__(ctx, rng, counters, peers)
        cfg, s = self.cfg, ctx.spaces
        q, a = cfg.qmix, cfg.agent
        hp = QmixHyper(gamma=a.gamma, td_lambda=q.td_lambda, lr=a.lr, grad_clip=a.grad_clip,
                       target_update=a.target_update, rnn_hidden=q.rnn_hidden, mixer_embed=q.mixer_embed,
                       hypernet_hidden=q.hypernet_hidden, loss_weights=q.loss_weights,
                       central_hidden=q.central_hidden)
        self.agent = QMixLearner(s.n_agents, s.obs_shape, s.state_shape, s.n_actions, hp,
                                 device=pick_device(a.device), seed=cfg.run.seed)
        self.sample_s = self.train_s = self.test_s = 0.0
        self.acc: dict[str, list] = {k: [] for k in (*STATS, "p_t")}
        self.tested_at = -1
        self.test_games: list | None = None

    def transferred(self, mean_value: float) -> None:
        self.acc["p_t"].append(mean_value)

    # -- checkpoints ---------------------------------------------------------------
    def state(self) -> dict:
        return {"agent": self.agent.state_dict(), "timers": [self.sample_s, self.train_s, self.test_s]}

    def restore(self, st: dict) -> None:
        self.agent.load_state_dict(st["agent"])
        self.sample_s, self.train_s, self.test_s = st["timers"]

    # -- metrics -------------------------------------------------------------------
    def file_attrs(self, threads: int) -> dict:
        cfg, s = self.cfg, self.ctx.spaces
        return {"role": "learner", "rank": self.ctx.topo.rank, "algorithm": "qmix",
                "architecture": cfg.replay.architecture,
                "sampler": cfg.qmix.sampler, "loss_weights": cfg.qmix.loss_weights, "env_id": cfg.env.id,
                "n_agents": s.n_agents, "n_actions": s.n_actions, "episode_limit": s.episode_limit,
                "device": str(self.agent.device), "torch_threads": threads, "n_params": self.agent.n_params,
                "batch_size": cfg.replay.batch_size}

    def columns(self) -> tuple[dict, dict]:
        return {**{k: F8 for k in STATS}, "p_t": F8}, {"sample_s": F8, "train_s": F8, "test_s": F8}

    def open_tables(self, file: MetricsFile) -> None:
        self.test_table = file.table("test", {
            "time": F8, "train_steps": I8, "env_steps": I8, "return_mean": F8, "return_std": F8,
            "captures": F8, "lone_catches": F8, "length": F8, "episodes": I8})
        if self.ctx.resume:
            self.test_table.truncate(self.test_table.rows_until("time", self.ctx.resume.job_time))

    def row(self) -> dict:
        mean = {k: float(np.nanmean(v)) if v and not np.isnan(v).all() else math.nan for k, v in self.acc.items()}
        for v in self.acc.values():
            v.clear()
        return {**mean, "sample_s": self.sample_s, "train_s": self.train_s, "test_s": self.test_s}

    # -- training --------------------------------------------------------------------
    def train(self, batch: Batch, peer_stats: np.ndarray | None = None) -> np.ndarray | None:
        """One train step on whole episodes; the episodes' new weights (AccMER's table, sent back), or None when
        skipped (the episodes keep their weights)."""
        self.sample_s += batch.sample_seconds
        t = time.perf_counter()
        stats = self.agent.train_step(batch.fields, self.peers)
        self.train_s += time.perf_counter() - t
        if stats["skipped"]:
            return None
        for k in STATS:
            self.acc[k].append(stats[k])
        if (self.agent.steps % self.cfg.qmix.test_every == 0 and self.agent.steps != self.tested_at
                and self.lead):  # one test round, the first learner's
            self.test()
        weights = stats["episode_weights"].astype(np.float32)
        bad = ~np.isfinite(weights)
        if bad.any():  # a weight the sampler cannot rank: those episodes keep the weights they had
            weights[bad] = np.asarray(batch.values, dtype=np.float32)[bad]
        return weights

    def divergence(self, in_a_row: int) -> str:
        a = self.agent
        if a.fault is None:  # only asked after skipped batches, each of which left its fault
            raise RuntimeError("divergence() asked before any batch was skipped")
        return divergence(a.fault, a.hp, in_a_row, a.steps, self.counters.skipped)

    def local_memory(self, capacity: int, rows: int) -> LocalEpisodes:
        return LocalEpisodes(self.ctx, capacity, rows)

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
        for g, game in enumerate(self.test_games):  # fresh seeds every round: different episodes each time
            obs[g], avail[g], _ = game.reset(seed=self.test_seed + 1000 * self.agent.steps + g)
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
        self.test_table.append(time=self.ctx.now(), train_steps=self.agent.steps, env_steps=sum(self.counters.env_steps),
                               return_mean=float(returns.mean()), return_std=float(returns.std()),
                               captures=float(np.nanmean(captures)) if np.isfinite(captures).any() else math.nan,
                               lone_catches=float(np.nanmean(lone)) if np.isfinite(lone).any() else math.nan,
                               length=float(lengths.mean()), episodes=n)
        self.test_s += time.perf_counter() - t0

    def finish(self) -> None:
        if self.agent.steps != self.tested_at and self.lead:
            self.test()  # the final policy's greedy return: the number a run is judged by
        for game in self.test_games or []:
            game.close()
