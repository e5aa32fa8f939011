"""The learner loop: train on batches, send priorities back, broadcast parameters.

*proposed*: batches come from the buffers. ``prefetch`` requests per buffer stay
in flight while a batch trains; each new request carries the priorities of the
batch just trained. With R buffers each serves its N/R share, and importance
weights use every sample's probability under those quotas.

*baseline*: the learner keeps a local prioritized replay and replaces it
wholesale with the buffers' contents every ``n_replay`` batches.

Every ``n_update`` batches the parameters go out in a versioned broadcast; the
last broadcast carries the stop flag.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from contextlib import contextmanager

import numpy as np
import torch

from mpirl.agents.dqn import DQNLearner, divergence, pick_device
from mpirl.comm.backoff import Backoff, wait_until
from mpirl.comm.messages import BYE, DUMP, SAMPLE, dump_layout, request_layout, sample_layout
from mpirl.comm.codec import codec_for
from mpirl.comm.link import shaper_for
from mpirl.comm.params import ParamBroadcast
from mpirl.metrics.writer import MetricsFile
from mpirl.replay.quotas import RateMeter, even_quotas, max_quota, rate_quotas
from mpirl.replay.frames import framed_fields
from mpirl.replay.shard import PrioritizedShard, importance_weights, linear_schedule
from mpirl.roles import checkpoint
from mpirl.roles.context import Interval, RoleContext
from mpirl.roles.preemption import PREEMPTED, signal_name
from mpirl.comm.buffer_link import BufferLink

F8, I8 = np.float64, np.int64
MAX_SKIPPED_IN_A_ROW = 100  # non-finite batches in a row that end the job as diverged


class Clock:
    """Seconds spent computing vs communicating (sending, receiving, waiting for messages)."""

    def __init__(self):
        self.compute = self.comm = 0.0

    @contextmanager
    def computing(self):
        t = time.perf_counter()
        yield
        self.compute += time.perf_counter() - t

    @contextmanager
    def communicating(self):
        t = time.perf_counter()
        yield
        self.comm += time.perf_counter() - t


class Learner:
    def __init__(self, ctx: RoleContext):
        cfg, topo = ctx.cfg, ctx.topo
        self.ctx, self.cfg = ctx, cfg
        # More compute threads than cores the rank may run on only makes them wait for each other.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.threads = min(cfg.agent.torch_threads, cores)
        torch.set_num_threads(self.threads)
        self.agent = self.make_agent()
        self.params = ParamBroadcast(topo.learner_params, self.agent.n_params, shaper=shaper_for(cfg.comm.link))
        n_buf = len(topo.buffers)
        self.quotas = even_quotas(cfg.replay.batch_size, n_buf)  # samples per shard in the next request
        self.meters = [RateMeter() for _ in range(n_buf)]  # each shard's insertion rate
        self.consumed = [0] * n_buf  # samples trained on, per shard
        self.links = self._open_links()
        self.clock = Clock()
        self.rng = np.random.default_rng(ctx.seed())
        self.returns: deque = deque(maxlen=cfg.run.return_window)
        # run.return_from = "least_exploring": only that actor's episodes count (buffers send NaN for the rest).
        self.counted_actor = topo.least_exploring_actor if cfg.run.return_from == "least_exploring" else None
        self.episodes = 0
        self.env_steps = [0] * len(topo.buffers)
        self.sizes = [0] * len(topo.buffers)
        self.version = 0
        self.skipped = self.skipped_in_a_row = 0  # batches skipped for a non-finite loss or gradient
        self.stop_reason = ""
        self.started = time.perf_counter()
        self.bytes_base = dict.fromkeys(("bytes_in", "bytes_in_raw", "bytes_out", "bytes_out_raw"), 0)
        # What each buffer's env steps add to its count: after a resume its actors count on from their last
        # metrics rows before the checkpoint (up to a log interval old), the learner from the checkpoint's count.
        self.env_offset = [0] * n_buf
        if ctx.resume:
            self._restore(checkpoint.load(ctx.resume.checkpoint, map_location=self.agent.device))
            for b, rank in enumerate(topo.buffers):
                resumed = sum(ctx.resume.actor_steps.get(a, 0) for a in topo.actors_of(rank))
                self.env_offset[b] = self.env_steps[b] - resumed
        self.last_checkpoint = time.perf_counter()
        self.checkpointed_at = self.published_at = self.refreshed_at = self.agent.steps
        self._open_metrics()

    def make_agent(self):
        """The learning agent (networks, optimizer, ``train_step``, ``flat_params``, ``steps``)."""
        cfg = self.cfg
        return DQNLearner(self.ctx.spaces.obs_shape, self.ctx.spaces.n_actions, cfg.agent,
                          pick_device(cfg.agent.device), seed=cfg.run.seed)

    # -- checkpoints ---------------------------------------------------------------
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

    def checkpoint(self) -> None:
        """Metrics up to now on disk first: a run resumed from here drops only rows after it."""
        if self.cfg.replay.architecture == "baseline":
            self.count_local_consumption()  # the counts saved (and sent with the goodbye) include every batch
        self.checkpointed_at = self.agent.steps
        self.log(force=True)
        self.file.flush()
        checkpoint.save(self.ctx.run_dir, self._state(), self.cfg.checkpoint.keep)
        self.last_checkpoint = time.perf_counter()

    def checkpoint_due(self) -> None:
        ck = self.cfg.checkpoint
        steps = self.agent.steps
        if ((ck.every_steps and steps % ck.every_steps == 0 and steps != self.checkpointed_at)
                or (ck.every_seconds and time.perf_counter() - self.last_checkpoint >= ck.every_seconds)):
            with self.clock.computing():
                self.checkpoint()

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

    def _open_links(self) -> list[BufferLink]:
        """One request/reply line per buffer (learner-side rank b + 1 on the learner communicator)."""
        cfg, spec, n_buf = self.cfg, self.ctx.spec, len(self.ctx.topo.buffers)
        most = max_quota(cfg.replay.batch_size, n_buf, cfg.replay.shares)
        proposed = cfg.replay.architecture == "proposed"
        framed = framed_fields(spec) if cfg.replay.dedup_frames else {}
        reply = sample_layout(spec, most) if proposed else dump_layout(spec, cfg.replay.capacity, framed)
        depth = cfg.comm.prefetch + 1 if proposed else 1
        return [BufferLink(self.ctx.topo.learner, b + 1, request_layout(most), reply, depth,
                           shaper=shaper_for(cfg.comm.link), codec=codec_for(cfg.comm.link),
                           chunk_bytes=int(cfg.comm.max_message_mb * 2**20)) for b in range(n_buf)]

    # -- bookkeeping shared by both architectures -------------------------------
    def link_bytes(self) -> dict:
        """Bytes over the buffer <-> learner link so far: on the wire and before compression.

        In: batches and dumps from the buffers. Out: requests with priorities, and the
        parameter broadcasts (never compressed).
        """
        links = self.links
        params = self.params.broadcasts * self.params.nbytes
        now = {"bytes_in": sum(link.bytes_received for link in links),
               "bytes_in_raw": sum(link.raw_bytes_received for link in links),
               "bytes_out": sum(link.sends.bytes_sent for link in links) + params,
               "bytes_out_raw": sum(link.sends.raw_bytes_sent for link in links) + params}
        return {k: v + self.bytes_base[k] for k, v in now.items()}  # a resumed run counts on

    def take_reply(self, b: int, link: BufferLink) -> dict[str, np.ndarray]:
        """The oldest reply of buffer ``b``: note its counters and episodes, return its record views."""
        buf = link.take()
        lay = link.reply
        self.env_steps[b] = int(lay.get(buf, "env_steps")) + self.env_offset[b]
        self.sizes[b] = int(lay.get(buf, "shard_size"))
        self.meters[b].update(time.perf_counter(), int(lay.get(buf, "inserted")))
        k = int(lay.get(buf, "episodes"))
        if k:
            rets = lay.get(buf, "ep_return")[:k]
            self.returns.extend(rets[~np.isnan(rets)].tolist())
            self.episodes += k
        return lay.views(buf)

    def pump(self) -> None:
        """Release messages held by the emulated long-haul link whose time has come."""
        for link in self.links:
            link.sends.pump()
        self.params.pump()

    def replies_ready(self) -> bool:
        """Pump the emulated link; True when every buffer's oldest reply has arrived."""
        self.params.pump()
        return all([link.progress() for link in self.links])

    def should_stop(self) -> bool:
        r = self.cfg.run
        notice = self.ctx.preempt.requested() if self.ctx.preempt else None
        if notice:
            rank, signum = notice
            self.stop_reason = f"{PREEMPTED}: {signal_name(signum)} on rank {rank} ({self.ctx.topo.role_of(rank)})"
        elif r.train_steps and self.agent.steps >= r.train_steps:
            self.stop_reason = f"train_steps {r.train_steps} reached"
        elif r.env_steps and sum(self.env_steps) >= r.env_steps:
            self.stop_reason = f"env_steps {r.env_steps} reached"
        elif r.wall_seconds and time.perf_counter() - self.started >= r.wall_seconds:
            self.stop_reason = f"wall_seconds {r.wall_seconds:g} reached"
        elif (not math.isnan(r.target_return) and len(self.returns) == self.returns.maxlen
              and np.mean(self.returns) >= r.target_return):
            whose = "" if self.counted_actor is None else f" of actor {self.counted_actor}"
            self.stop_reason = f"mean return of the last {r.return_window} episodes{whose} reached {r.target_return:g}"
        return bool(self.stop_reason)

    def publish(self, stop: bool = False) -> None:
        with self.clock.communicating():
            self.version += 1
            self.params.publish(self.version, self.agent.flat_params(), stop=stop)

    def publish_due(self) -> None:
        steps = self.agent.steps
        if steps % self.cfg.comm.n_update == 0 and steps != self.published_at:  # a skipped batch is no step
            self.published_at = steps
            self.publish()

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

    # -- the loops ---------------------------------------------------------------
    def run(self) -> str:
        proposed = self.cfg.replay.architecture == "proposed"
        self.publish()  # version 1: every actor starts from the learner's initial weights
        (self.run_proposed if proposed else self.run_baseline)()
        self.shutdown()
        return self.stop_reason

    def run_proposed(self) -> None:
        clock = self.clock
        with clock.communicating():
            for _ in range(self.cfg.comm.prefetch + 1):
                for b, link in enumerate(self.links):  # a resumed run's counts continue, never back to 0
                    link.request(SAMPLE, self.quotas[b], consumed=self.consumed[b])
        backoff = Backoff()
        while not self.should_stop():
            with clock.communicating():  # polling, sleeping and taking the replies: all waiting on the link
                ready = self.replies_ready()
                if ready:
                    views = [self.take_reply(b, link) for b, link in enumerate(self.links)]
                else:
                    self.log()
                    backoff.sleep()
            if not ready:
                continue
            backoff.reset()
            with clock.computing():
                td = self.train_on(views)
            with clock.communicating():
                if self.cfg.replay.shares == "rate":
                    self.quotas = rate_quotas(self.cfg.replay.batch_size, [m.rate for m in self.meters])
                start = 0
                for b, link in enumerate(self.links):
                    v, rows = views[b], len(views[b]["ids"])
                    self.consumed[b] += rows
                    link.release()
                    link.request(SAMPLE, self.quotas[b], consumed=self.consumed[b],
                                 ids=v["ids"], versions=v["versions"], priority=td[start:start + rows])
                    start += rows
            self.publish_due()
            self.checkpoint_due()
            self.log()

    def train_on(self, views: list[dict]) -> np.ndarray:
        """Assemble one batch from every buffer's share and train on it.

        A sample from buffer b was drawn with probability share_b / N * p_i / total_b;
        importance weights use that and the total size over all shards.
        """
        spec = self.ctx.spec
        n = self.cfg.replay.batch_size
        probs = np.concatenate([v["probs"] * (len(v["probs"]) / n) for v in views])
        prio = np.concatenate([v["priority"] for v in views])
        self.last_p_t = float(prio.mean())
        self.acc["p_t"].append(self.last_p_t)
        if len(views) == 1:
            batch = {name: views[0][name] for name in spec}
        else:
            batch = {name: np.concatenate([v[name] for v in views]) for name in spec}
        return self.train(batch, probs, sum(self.sizes), prio)

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
            if local.size < need and time.perf_counter() < next_try:
                self.log()
                with clock.communicating():  # waiting for the buffers to fill
                    time.sleep(0.01)
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

    def count_local_consumption(self) -> None:
        """Baseline: the batches since the last refresh sampled the memory the last dumps made; attribute them
        to each shard by its share of it. Counts only grow (a resumed run starts from its checkpoint's)."""
        trained = (self.agent.steps - self.refreshed_at) * self.cfg.replay.batch_size
        total = sum(self.sizes)
        if trained and total:
            upto = trained * np.cumsum(self.sizes) // total  # shares that add up to `trained` exactly
            for b, share in enumerate(np.diff(upto, prepend=0)):
                self.consumed[b] += int(share)
            self.refreshed_at = self.agent.steps

    def refresh(self, local: PrioritizedShard) -> None:
        """Replace the local replay with every buffer's latest experiences (baseline).

        The transfer counts as communication, rebuilding the local memory as compute.
        """
        self.count_local_consumption()
        with self.clock.communicating():
            for b, link in enumerate(self.links):
                link.request(DUMP, 0, consumed=self.consumed[b])
            wait_until(self.replies_ready)
            dumps = [self.take_reply(b, link) for b, link in enumerate(self.links)]
        with self.clock.computing():
            local.clear()
            priorities = [v.pop("priority") for v in dumps]
            for v, prio in zip(dumps, priorities):
                if not len(prio):
                    continue
                if "frames" in v:  # each distinct frame once, stacks as indices into them
                    local.add_framed(v, v.pop("frames"), prio)
                else:
                    local.add(v, prio)
            if local.size:
                self.last_p_t = float(np.concatenate(priorities).mean())
                self.acc["p_t"].append(self.last_p_t)
        for link in self.links:
            link.release()

    def shutdown(self) -> None:
        """A checkpoint, the last broadcast with the stop flag, goodbye to the buffers, drain every reply.

        The checkpoint's row is the last learner/train row: nothing trains after it. What crosses after it
        (the stop broadcast, the replies in flight at the stop) is in the file's totals, the root attributes
        ``bytes_in``, ``bytes_in_raw``, ``bytes_out`` and ``bytes_out_raw``.
        """
        self.checkpoint()
        self.publish(stop=True)
        for link in self.links:
            link.request(BYE, 0, consumed=self.consumed[self.links.index(link)], train_steps=self.agent.steps)
        for link in self.links:
            link.close()
        self.params.close()
        self.file.set_attrs(stop_reason=self.stop_reason, train_steps=self.agent.steps, **self.link_bytes())
        self.file.close()


def run_learner(ctx: RoleContext) -> str:
    return Learner(ctx).run()
