"""The learner loop of the replay-based algorithms: batches from the buffers, priorities back, parameters out.

*proposed*: batches come from the buffers. ``prefetch`` requests per buffer stay
in flight while a batch trains; each new request carries the values (priorities,
weights) of the batch just trained. With R buffers each serves its N/R share.

*baseline*: the learner keeps a local replay and replaces it wholesale with the
buffers' contents every ``n_replay`` batches (:meth:`Learner.refresh`); the
algorithm's ``run_baseline`` samples and trains on it.

Every ``n_update`` batches the parameters go out in a versioned broadcast; the
last broadcast carries the stop flag.

With the inference worker on the learner's rank (``topology.workers = "learner"``, DMCAF's AW) the
learner holds a :class:`~mpirl.roles.worker.Worker` and interleaves: it answers its actors' requests
before each train step and while it waits for replies or dumps, loads each version it publishes, and
tells the actors to stop at the end. The loop never names an algorithm: the
algorithm's learner provides ``make_agent``, ``train`` (one batch -> the values to
send back), ``_state``/``_restore`` (its checkpoint), ``_open_metrics``/``log`` (its
tables) and ``run_baseline``.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from contextlib import contextmanager

import numpy as np
import torch

from mpirl.comm.backoff import Backoff, wait_until
from mpirl.comm.buffer_link import BufferLink
from mpirl.comm.codec import codec_for
from mpirl.comm.link import shaper_for
from mpirl.comm.messages import BYE, DUMP, SAMPLE, dump_layout, request_layout, sample_layout
from mpirl.comm.params import ParamBroadcast
from mpirl.replay.frames import framed_fields
from mpirl.replay.quotas import RateMeter, even_quotas, max_quota, rate_quotas
from mpirl.roles import checkpoint
from mpirl.roles.context import RoleContext
from mpirl.roles.preemption import PREEMPTED, signal_name
from mpirl.roles.worker import Worker

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


def joined(views: list[dict], names: list[str]) -> dict[str, np.ndarray]:
    """One batch from every buffer's share: fields concatenated; with frames once, the frames too, and each
    share's ``<name>_idx`` moved past the frames of the shares before it."""
    if len(views) == 1:
        return {name: views[0][name] for name in names}
    out = {name: np.concatenate([v[name] for v in views]) for name in names if not name.endswith("_idx")}
    offsets = np.cumsum([0] + [len(v["frames"]) for v in views[:-1]]) if "frames" in names else None
    for name in names:
        if name.endswith("_idx"):
            out[name] = np.concatenate([v[name] + off for v, off in zip(views, offsets)])
    return out


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
        self.server = None  # the worker on this rank (AW)
        if ctx.serving:
            self.server = Worker(ctx, ctx.serving)
            torch.set_num_threads(self.threads)  # the worker's decisions set one thread, as for a worker rank
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

    # -- checkpoints ---------------------------------------------------------------
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

    def _open_links(self) -> list[BufferLink]:
        """One request/reply line per buffer (learner-side rank b + 1 on the learner communicator)."""
        cfg, spec, n_buf = self.cfg, self.ctx.spec, len(self.ctx.topo.buffers)
        most = max_quota(cfg.replay.batch_size, n_buf, cfg.replay.shares)
        proposed = cfg.replay.architecture == "proposed"
        framed = framed_fields(spec) if cfg.replay.dedup_frames else {}
        reply = sample_layout(spec, most, framed) if proposed else dump_layout(spec, cfg.replay.capacity, framed)
        # A batch's record fields as replies carry them: with frames once, stacks as indices into "frames".
        self.batch_fields = [name for name in reply.fields if name not in ("ids", "versions", "probs", "priority")]
        self.batch_fields += list(reply.counted)
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
            flat = self.agent.flat_params()
            self.params.publish(self.version, flat, stop=stop)
        if self.server and not stop:
            self.server.load(flat, self.version)

    def serve(self) -> bool:
        """With the worker on this rank: a turn of it; True when it answered a pass."""
        return self.server is not None and self.server.turn() == 0

    def idle(self, seconds: float) -> None:
        """Wait ``seconds`` (counted as communication), serving the actors meanwhile when the worker is here."""
        with self.clock.communicating():
            if self.server is None:
                time.sleep(seconds)
                return
            end, backoff = time.perf_counter() + seconds, Backoff()
            while time.perf_counter() < end:
                if self.serve():
                    backoff.reset()
                else:
                    backoff.sleep()

    def _served_replies_ready(self) -> bool:
        self.serve()
        return self.replies_ready()

    def publish_due(self) -> None:
        steps = self.agent.steps
        if steps % self.cfg.comm.n_update == 0 and steps != self.published_at:  # a skipped batch is no step
            self.published_at = steps
            self.publish()

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
            served = self.serve()
            with clock.communicating():  # polling, sleeping and taking the replies: all waiting on the link
                ready = self.replies_ready()
                if ready:
                    views = [self.take_reply(b, link) for b, link in enumerate(self.links)]
                else:
                    self.log()
                    if served:
                        backoff.reset()
                    else:
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
        n = self.cfg.replay.batch_size
        probs = np.concatenate([v["probs"] * (len(v["probs"]) / n) for v in views])
        prio = np.concatenate([v["priority"] for v in views])
        self.last_p_t = float(prio.mean())
        self.acc["p_t"].append(self.last_p_t)
        return self.train(joined(views, self.batch_fields), probs, sum(self.sizes), prio)

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

    def refresh(self, local) -> None:
        """Replace the local replay with every buffer's latest experiences (baseline).

        The transfer counts as communication, rebuilding the local memory as compute.
        """
        self.count_local_consumption()
        with self.clock.communicating():
            for b, link in enumerate(self.links):
                link.request(DUMP, 0, consumed=self.consumed[b])
            wait_until(self._served_replies_ready)
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
        if self.server:  # the actors learn the stop in their next answer; the worker's goodbye to the buffer
            self.server.finish()
        for link in self.links:
            link.request(BYE, 0, consumed=self.consumed[self.links.index(link)], train_steps=self.agent.steps)
        for link in self.links:
            link.close()
        self.params.close()
        self.file.set_attrs(stop_reason=self.stop_reason, train_steps=self.agent.steps, **self.link_bytes())
        self.file.close()
