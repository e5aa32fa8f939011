"""The Ape-X learner: dueling double DQN on prioritized n-step batches, over the one learner loop
(:mod:`mpirl.actor_learner.learner`): its agent, its train step with importance weights, its checkpoint state, its
tables, and the local prioritized replay the learner keeps when the buffers dump to it.
"""

from __future__ import annotations

import math

import numpy as np

from mpirl.agents.dqn import DQNLearner, divergence
from mpirl.agents.tensors import pick_device
from mpirl.metrics.writer import MetricsFile
from mpirl.replay.weights import importance_weights, linear_schedule
from mpirl.job.context import RoleContext
from mpirl.actor_learner.batch_sources import Batch
from mpirl.actor_learner.learner_algorithm import LearnerAlgorithm
from mpirl.actor_learner.learner_peers import LearnerPeers, smallest
from mpirl.actor_learner.counters import Counters

F8, I8 = np.float64, np.int64
STATS = ("loss", "p_s", "p_t", "td_abs")


class LocalPrioritized:
    """The learner's own prioritized replay, filled from the buffers' dumps."""

    def __init__(self, ctx: RoleContext, capacity: int, rows: int):
        from mpirl.replay.shard import PrioritizedShard  # numba's kernels: the baseline placement's learner alone
        rp = ctx.cfg.replay
        self.shard = PrioritizedShard(ctx.spec, capacity, rp.alpha, rp.priority_eps, dedup_frames=rp.dedup_frames)
        self.batch_size = rows  # the batch, or this learner's part of it (K data-parallel learners)
        self.need = max(rp.learning_starts, 1)
        self.out = {name: np.zeros((rows, *shape), dtype) for name, (shape, dtype) in ctx.spec.items()}

    @property
    def size(self) -> int:
        return self.shard.size

    def clear(self) -> None:
        self.shard.clear()

    def add_dump(self, views: dict[str, np.ndarray], values: np.ndarray) -> None:
        if "frames" in views:  # each distinct frame once, stacks as indices into them
            self.shard.add_framed(views, views.pop("frames"), values)
        else:
            self.shard.add(views, values)

    def sample(self, rng: np.random.Generator) -> Batch:
        s = self.shard.sample(self.batch_size, rng, out=self.out)
        return Batch(self.out, s.priorities, s.probs, self.shard.size, origin=s)

    def give_back(self, batch: Batch, values: np.ndarray) -> None:
        self.shard.update_priorities(batch.origin.ids, batch.origin.versions, values)


class ApexTraining(LearnerAlgorithm):
    """Ape-X's side of the learner loop: the dueling double DQN, its importance-weighted train step, its columns."""

    agent: DQNLearner

    def __init__(self, ctx: RoleContext, rng: np.random.Generator, counters: Counters,
                 peers: LearnerPeers | None = None):
        super().__init__(ctx, rng, counters, peers)
        cfg = self.cfg
        self.agent = DQNLearner(ctx.spaces.obs_shape, ctx.spaces.n_actions, cfg.agent, pick_device(cfg.agent.device),
                                seed=cfg.run.seed)
        self.acc: dict[str, list] = {k: [] for k in STATS}
        # One row per train step, for curves within an epoch (p_t: the last transfer's mean priority).
        self.per_batch: dict[str, list] = {name: [] for name in ("train_step", *STATS)}
        self.last_p_t = math.nan

    def transferred(self, mean_value: float) -> None:
        self.last_p_t = mean_value
        self.acc["p_t"].append(mean_value)

    def shared_stat(self, batch: Batch) -> float:
        """This learner's smallest sampling probability: the largest importance weight of the whole batch, which
        normalises every weight, is at the smallest over the learners' parts."""
        return smallest(batch.probs)

    def train(self, batch: Batch, peer_stats: np.ndarray | None = None) -> np.ndarray | None:
        """One train step with importance weights; the new |TD|, or None when skipped. With K learners the
        weights are normalised by the whole batch's largest (``peer_stats``: each part's smallest probability) and
        the gradients summed over the learners (the agent's step with ``peers``)."""
        rp = self.cfg.replay
        beta = linear_schedule(rp.beta, rp.beta_final, self.agent.steps, rp.beta_steps)
        if batch.probs is None:
            raise ValueError("a prioritized batch carries each sample's probability")
        whole = None if peer_stats is None else float(np.min(peer_stats))
        weights = importance_weights(batch.probs, batch.size, beta, smallest=whole)
        loss, td = self.agent.train_step(batch.fields, weights, self.peers)
        if td is None:  # the batch keeps its priorities
            return None
        p_s, td_abs = float(batch.values.mean()), float(td.mean())
        self.acc["loss"].append(loss)
        self.acc["p_s"].append(p_s)
        self.acc["td_abs"].append(td_abs)
        for key, value in zip(self.per_batch, (self.agent.steps, loss, p_s, self.last_p_t, td_abs)):
            self.per_batch[key].append(value)
        return td

    def divergence(self, in_a_row: int) -> str:
        a = self.agent
        if a.fault is None:  # only asked after skipped batches, each of which left its fault
            raise RuntimeError("divergence() asked before any batch was skipped")
        return divergence(a.fault, self.cfg.flat(), in_a_row, a.steps, self.counters.skipped)

    def state(self) -> dict:
        a = self.agent
        return {"online": a.online.state_dict(), "target": a.target.state_dict(),
                "optimizer": a.optimizer.state_dict()}

    def restore(self, st: dict) -> None:
        a = self.agent
        a.online.load_state_dict(st["online"])
        a.target.load_state_dict(st["target"])
        a.optimizer.load_state_dict(st["optimizer"])
        a.steps = int(st["train_steps"])

    def file_attrs(self, threads: int) -> dict:
        return {"role": "learner", "rank": self.ctx.topo.rank, "architecture": self.cfg.replay.architecture,
                "device": str(self.agent.device), "precision": self.agent.precision, "torch_threads": threads,
                "n_params": self.agent.n_params, "batch_size": self.cfg.replay.batch_size}

    def columns(self) -> tuple[dict, dict]:
        return {k: F8 for k in STATS}, {}

    def open_tables(self, file: MetricsFile) -> None:
        self.batch_table = file.table("batches", {"train_step": I8, **{k: F8 for k in STATS}})
        if self.ctx.resume:
            self.batch_table.truncate(self.batch_table.rows_until("train_step", self.ctx.resume.train_steps))

    def row(self) -> dict:
        mean = {k: float(np.mean(v)) if v else math.nan for k, v in self.acc.items()}
        if self.per_batch["train_step"]:
            self.batch_table.extend(**{k: np.asarray(v) for k, v in self.per_batch.items()})
        for v in (*self.acc.values(), *self.per_batch.values()):
            v.clear()
        return mean

    def local_memory(self, capacity: int, rows: int) -> LocalPrioritized:
        return LocalPrioritized(self.ctx, capacity, rows)
