"""The IMPALA learner: an actor-critic trained with V-trace on batches of trajectories, over the one learner loop
(:mod:`mpirl.actor_learner.learner`) and its remote source: each buffer's queue serves its share of every batch, oldest
trajectories first, each once.

Every ``impala.test_episodes`` episodes played by the learner with its policy (sampled, as the actors act), every
``impala.test_every`` train steps and at the stop, go to the ``test`` table.

Its ``train`` rows add the losses, the entropy, the share of importance ratios rho_bar clipped, the gradient's norm
(before clipping) and the policy lag: the learner's parameter version minus the version each trajectory was acted
with, mean and max per batch, averaged over the row's batches (the max: the largest of them).
"""

from __future__ import annotations

import math
import time

import numpy as np

from mpirl.agents.actor_critic import ImpalaLearner
from mpirl.agents.tensors import pick_device
from mpirl.algos.impala.serving import with_version
from mpirl.metrics.writer import MetricsFile
from mpirl.actor_learner.batch_sources import Batch, BatchSource, SourceInputs
from mpirl.job.context import RoleContext
from mpirl.actor_learner.learner_algorithm import LearnerAlgorithm
from mpirl.actor_learner.counters import Counters
from mpirl.actor_learner.learner_peers import LearnerPeers
from mpirl.agents.sampling import uniform_entropy
from mpirl.agents.schedules import progress_of, scheduled
from mpirl.agents.running_stats import needs_shift
from mpirl.agents.test_play import TEST_COLUMNS, play_test
from mpirl.envs.factory import reference_observation

F8, I8 = np.float64, np.int64
STATS = ("loss", "policy_loss", "value_loss", "entropy", "rho_clipped", "advantage", "grad_norm", "lag_mean")


class ImpalaTraining(LearnerAlgorithm):
    """IMPALA's side of the learner loop."""

    agent: ImpalaLearner

    def __init__(self, ctx: RoleContext, rng: np.random.Generator, counters: Counters,
                 peers: LearnerPeers | None = None):
        super().__init__(ctx, rng, counters, peers)
        cfg = self.cfg
        shift = reference_observation(cfg.env) if needs_shift(cfg.agent, ctx.spaces.obs_dtype) else None
        self.agent = ImpalaLearner(ctx.spaces.obs_shape, ctx.spaces.action, cfg.agent, cfg.impala,
                                   pick_device(cfg.agent.device), seed=ctx.seed(),
                                   schedules=scheduled(cfg, {"lr": (cfg.agent.lr, cfg.agent.lr_final),
                                                             "entropy_coef": (cfg.impala.entropy_coef,
                                                                              cfg.impala.entropy_final)}),
                                   obs_shift=shift, obs_dtype=ctx.spaces.obs_dtype)
        self.acc: dict[str, list[float]] = {k: [] for k in (*STATS, "lag_max")}

    @property
    def n_params(self) -> int:
        return self.agent.n_params + 1  # the broadcast carries the version after the parameters

    def flat_params(self) -> np.ndarray:
        """The network's parameters, then the version they are published as (the loop has counted it already):
        the actors record it with each trajectory (:mod:`mpirl.algos.impala.serving`)."""
        return with_version(self.agent.flat_params(), self.counters.version)

    def train(self, batch: Batch, peer_stats: np.ndarray | None = None) -> np.ndarray | None:
        self.agent.at(progress_of(self.cfg, self.agent.steps, sum(self.counters.env_steps)))
        stats = self.agent.train_step(batch.fields)
        if stats is None:
            return None
        lag = self.counters.version - batch.fields["version"]
        stats["lag_mean"] = float(lag.mean())
        stats["lag_max"] = float(lag.max())
        for k, v in stats.items():
            self.acc[k].append(v)
        every = self.cfg.impala.test_every
        if every and self.agent.steps % every == 0:
            self.test()
        return np.ones(len(lag), np.float32)  # nothing goes back to a queue

    def divergence(self, in_a_row: int) -> str:
        c = self.cfg
        return (f"the learner has diverged: {in_a_row} batches in a row were not finite after train step "
                f"{self.agent.steps} ({self.counters.skipped} skipped in all); in the last, {self.agent.fault}; "
                f"the settings that feed it: agent.lr={c.agent.lr:g}, agent.grad_clip={c.agent.grad_clip:g}, "
                f"agent.reward_clip={c.agent.reward_clip:g}, impala.rho_bar={c.impala.rho_bar:g}")

    def state(self) -> dict:
        return self.agent.state()

    def restore(self, st: dict) -> None:
        self.agent.restore(st)

    def file_attrs(self, threads: int) -> dict:
        return {"role": "learner", "rank": 0, "algorithm": "impala", "architecture": "queue",
                "uniform_entropy": uniform_entropy(self.ctx.spaces.action),
                "device": str(self.agent.device),
                "torch_threads": threads, "n_params": self.agent.n_params, "batch_size": self.cfg.replay.batch_size,
                "unroll": self.cfg.impala.unroll}

    def columns(self) -> tuple[dict, dict]:
        return {k: F8 for k in (*STATS, "lag_max")}, {}

    def batch_source(self, given: SourceInputs) -> BatchSource | None:
        """With ``topology.buffers = 0`` the learner's own queue; else the buffers' queues (remote shards)."""
        if self.ctx.topo.learner is None:
            from mpirl.algos.impala.local_queue import LocalQueue
            return LocalQueue(given)
        return None

    def open_tables(self, file: MetricsFile) -> None:
        self.test_table = file.table("test", TEST_COLUMNS)
        if self.ctx.resume:
            self.test_table.truncate(self.test_table.rows_until("time", self.ctx.resume.job_time))

    def finish(self) -> None:
        """The stop's test round, unless the job is being preempted: its grace time is for the checkpoint."""
        if not (self.ctx.preempt and self.ctx.preempt.requested()):
            self.test()

    def test(self) -> None:
        """``impala.test_episodes`` episodes of the current policy, one game each, stepped together; a row."""
        n, cfg = self.cfg.impala.test_episodes, self.cfg
        if not n:
            return
        t0 = time.perf_counter()
        played = play_test(self.agent.net, cfg, self.ctx.spaces, n, self.ctx.seed() + 1_000_003 + self.agent.steps,
                           self.agent.device, self.agent.norm.normalize)
        self.test_table.append(time=self.ctx.now(), train_steps=self.agent.steps,
                               env_steps=sum(self.counters.env_steps), **played, seconds=time.perf_counter() - t0)

    def row(self) -> dict:
        out = {k: float(np.mean(v)) if v else math.nan for k, v in self.acc.items()}
        out["lag_max"] = float(np.max(self.acc["lag_max"])) if self.acc["lag_max"] else math.nan
        for v in self.acc.values():
            v.clear()
        return out
