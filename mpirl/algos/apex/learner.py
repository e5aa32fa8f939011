"""The Ape-X learner: dueling double DQN on prioritized n-step batches, over the shared learner loop
(:mod:`mpirl.roles.replay_learner`): its agent, its train step with importance weights, its checkpoint
state, its tables, and the baseline placement's local prioritized replay.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from mpirl.agents.dqn import DQNLearner, divergence, pick_device
from mpirl.metrics.writer import MetricsFile
from mpirl.replay.shard import PrioritizedShard, importance_weights, linear_schedule
from mpirl.roles import checkpoint
from mpirl.roles.context import Interval, RoleContext
from mpirl.roles.replay_learner import MAX_SKIPPED_IN_A_ROW, Learner

F8, I8 = np.float64, np.int64


class ApexLearner(Learner):
    def make_agent(self):
        """The learning agent (networks, optimizer, ``train_step``, ``flat_params``, ``steps``)."""
        cfg = self.cfg
        return DQNLearner(self.ctx.spaces.obs_shape, self.ctx.spaces.n_actions, cfg.agent,
                          pick_device(cfg.agent.device), seed=cfg.run.seed)

    def _state(self) -> dict:
        a = self.agent
        return {"identity": checkpoint.identity(self.cfg, self.ctx.topo.world.size),
                "train_steps": a.steps, "job_time": self.ctx.now(),
                "learner_seconds": time.perf_counter() - self.started,
                "online": a.online.state_dict(), "target": a.target.state_dict(),
                "optimizer": a.optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                "numpy_rng": self.rng.bit_generator.state, "version": self.version, "episodes": self.episodes,
                "returns": list(self.returns), "env_steps": list(self.env_steps), "consumed": list(self.consumed),
                "skipped": self.skipped,
                "clock": [self.clock.compute, self.clock.comm], "link_bytes": self.link_bytes()}

    def _restore(self, st: dict) -> None:
        a = self.agent
        a.online.load_state_dict(st["online"])
        a.target.load_state_dict(st["target"])
        a.optimizer.load_state_dict(st["optimizer"])
        a.steps = int(st["train_steps"])
        torch.set_rng_state(st["torch_rng"].cpu())
        self.rng.bit_generator.state = st["numpy_rng"]
        self.version, self.episodes = int(st["version"]), int(st["episodes"])
        self.returns.extend(st["returns"])
        self.env_steps, self.consumed = list(st["env_steps"]), list(st["consumed"])
        self.skipped = int(st["skipped"])
        self.clock.compute, self.clock.comm = st["clock"]
        self.bytes_base = dict(st["link_bytes"])
        self.started = time.perf_counter() - float(st["learner_seconds"])  # run.wall_seconds counts on

    def _open_metrics(self) -> None:
        ctx = self.ctx
        self.file = MetricsFile(ctx.run_dir / "learner.h5", flush_seconds=self.cfg.log.flush_seconds,
                                attrs={"role": "learner", "rank": 0, "architecture": self.cfg.replay.architecture,
                                       "device": str(self.agent.device), "precision": self.agent.precision,
                                       "torch_threads": self.threads,
                                       "n_params": self.agent.n_params,
                                       "batch_size": self.cfg.replay.batch_size}, resume=bool(ctx.resume))
        self.table = self.file.table("train", {
            "time": F8, "train_steps": I8, "env_steps": I8, "loss": F8, "p_s": F8, "p_t": F8, "td_abs": F8,
            "train_steps_per_s": F8, "compute_s": F8, "comm_s": F8,
            "bytes_in": I8, "bytes_in_raw": I8, "bytes_out": I8, "bytes_out_raw": I8, "samples_trained": I8,
            "return_mean20": F8, "episodes": I8, "param_version": I8, "skipped_batches": I8})
        # Per shard (one row per buffer per interval): the quota asked for, its size and insertion rate.
        self.shard_table = self.file.table("shards", {
            "time": F8, "buffer": I8, "quota": I8, "size": I8, "inserted_per_s": F8, "consumed": I8})
        # One row per train step, for curves within an epoch (p_t: the last transfer's mean priority).
        self.batch_table = self.file.table("batches", {"train_step": I8, "loss": F8, "p_s": F8, "p_t": F8,
                                                       "td_abs": F8})
        if ctx.resume:  # rows after the checkpoint describe work the resumed run does again
            for table in (self.table, self.shard_table):
                table.truncate(table.rows_until("time", ctx.resume.job_time))
            self.batch_table.truncate(self.batch_table.rows_until("train_step", ctx.resume.train_steps))
        self.per_batch = {name: [] for name in ("train_step", "loss", "p_s", "p_t", "td_abs")}
        self.last_p_t = math.nan
        self.tick = Interval(self.cfg.log.interval)
        self.acc = {"loss": [], "p_s": [], "p_t": [], "td_abs": []}
        # The last row's train steps and skipped batches (a resumed run's: its checkpoint's) and its time: a row's
        # rate spans the time since the row before, or since here for the first.
        self.last_row, self.last_t = (self.agent.steps, self.skipped), time.perf_counter()

    def train(self, batch: dict, probs: np.ndarray, n_total: int, sampled_priority: np.ndarray) -> np.ndarray:
        """One train step (callers account its time as compute); returns the new |TD|."""
        beta = linear_schedule(self.cfg.replay.beta, self.cfg.replay.beta_final, self.agent.steps,
                               self.cfg.replay.beta_steps)
        weights = importance_weights(probs, n_total, beta)
        loss, td = self.agent.train_step(batch, weights)
        if td is None:  # non-finite loss or gradient: skipped, counted, the batch keeps its priorities
            self.skipped += 1
            self.skipped_in_a_row += 1
            if self.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
                raise FloatingPointError(divergence(self.agent.fault, self.cfg.flat(), self.skipped_in_a_row,
                                                    self.agent.steps, self.skipped))
            return np.array(sampled_priority, dtype=np.float32)
        self.skipped_in_a_row = 0
        p_s, td_abs = float(sampled_priority.mean()), float(td.mean())
        self.acc["loss"].append(loss)
        self.acc["p_s"].append(p_s)
        self.acc["td_abs"].append(td_abs)
        for key, value in zip(self.per_batch, (self.agent.steps, loss, p_s, self.last_p_t, td_abs)):
            self.per_batch[key].append(value)
        return td

    def log(self, force: bool = False) -> None:
        if not (self.tick.due() or force):
            self.file.flush_if_due()
            return
        now = time.perf_counter()
        if (self.agent.steps, self.skipped) == self.last_row:
            # No batch since the last row, trained or skipped (warm-up, a refill after a resume, a checkpoint or the
            # stop right after a row): no row, so no train step appears twice; the next row's rate spans the time
            # since the last row, as its counters' growth does.
            self.file.flush_if_due()
            return
        mean = {k: float(np.mean(v)) if v else math.nan for k, v in self.acc.items()}
        self.table.append(
            time=self.ctx.now(), train_steps=self.agent.steps, env_steps=sum(self.env_steps),
            train_steps_per_s=(self.agent.steps - self.last_row[0]) / max(now - self.last_t, 1e-9),
            compute_s=self.clock.compute, comm_s=self.clock.comm, **self.link_bytes(),
            samples_trained=self.agent.steps * self.cfg.replay.batch_size,
            return_mean20=float(np.mean(self.returns)) if self.returns else math.nan,
            episodes=self.episodes, param_version=self.version, skipped_batches=self.skipped, **mean)
        self.last_row, self.last_t = (self.agent.steps, self.skipped), now
        n = len(self.sizes)
        self.shard_table.extend(time=np.full(n, self.ctx.now()), buffer=np.array(self.ctx.topo.buffers),
                                quota=np.array(self.quotas), size=np.array(self.sizes),
                                inserted_per_s=np.array([m.rate for m in self.meters]), consumed=np.array(self.consumed))
        if self.per_batch["train_step"]:
            self.batch_table.extend(**{k: np.asarray(v) for k, v in self.per_batch.items()})
        for v in (*self.acc.values(), *self.per_batch.values()):
            v.clear()
        self.file.flush_if_due()

    def run_baseline(self) -> None:
        cfg, clock = self.cfg, self.clock
        total = cfg.replay.capacity * len(self.links)
        local = PrioritizedShard(self.ctx.spec, total, cfg.replay.alpha, cfg.replay.priority_eps,
                                 dedup_frames=cfg.replay.dedup_frames)
        batch = {name: np.zeros((cfg.replay.batch_size, *shape), dtype) for name, (shape, dtype) in self.ctx.spec.items()}
        need = max(cfg.replay.learning_starts, 1)
        next_try = 0.0
        while not self.should_stop():
            self.pump()
            self.serve()
            if local.size < need and time.perf_counter() < next_try:
                self.log()
                self.idle(0.01)  # waiting for the buffers to fill
                continue
            if self.agent.steps % cfg.replay.n_replay == 0 or local.size < need:
                self.refresh(local)
                if local.size < need:
                    # Not enough yet: ask again when the buffers' insertion rate says there will be,
                    # instead of shipping the whole (possibly GB-sized) memory again and again.
                    rate = np.nansum([m.rate for m in self.meters])
                    wait = (need - local.size) / rate if rate > 0 else 0.2
                    next_try = time.perf_counter() + min(max(wait, 0.05), 5.0)
                    continue
            with clock.computing():
                s = local.sample(cfg.replay.batch_size, self.rng, out=batch)
                td = self.train(batch, s.probs, local.size, s.priorities)
                local.update_priorities(s.ids, s.versions, td)
            self.publish_due()
            self.checkpoint_due()
            self.log()



def run_learner(ctx: RoleContext) -> str:
    return ApexLearner(ctx).run()
