"""Where the learner loop's batches come from, and where their new values go.

* :class:`RemoteShards`: batches come from the buffers. ``prefetch`` requests per buffer stay in flight while a
  batch trains; each new request carries the values (priorities, weights) of the batch just trained. With R
  buffers each serves its N/R share (``replay.shares``: even or by insertion rate).
* :class:`LocalMemory`: the learner keeps a local replay of the algorithm's kind (:class:`LocalReplay`) and
  replaces it wholesale with the buffers' contents every ``replay.n_replay`` batches; the values go back into it.
  K data-parallel learners each keep a copy of the dumps and draw their part of every batch from it.

An algorithm without replay adds a source of its own (a trajectory queue) that satisfies :class:`BatchSource`.
Every source is made from :class:`SourceInputs`, what the loop hands it: it never holds the loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

from mpirl.comm.backoff import Backoff, wait_until
from mpirl.comm.messages import DUMP, SAMPLE, dump_layout, episode_slots, sample_layout
from mpirl.config import JobConfig
from mpirl.job.context import RoleContext
from mpirl.metrics.writer import MetricsFile
from mpirl.replay.frame_cache import FrameCache, cache_slots
from mpirl.replay.frames import framed_fields
from mpirl.replay.quotas import max_quota, rate_quotas
from mpirl.actor_learner.counters import Clock, Counters
from mpirl.actor_learner.shard_links import ShardLinks, joined

if TYPE_CHECKING:
    import torch


@dataclass
class Batch:
    """One batch as a source hands it to the algorithm."""

    fields: dict[str, np.ndarray]  # the record fields, as the algorithm's train step takes them
    values: np.ndarray  # the values the memory held for them (priorities, weights): kept when a step is skipped
    probs: np.ndarray | None  # the probability each sample was drawn with (importance weights), None if uniform
    size: int  # how many samples the memory they were drawn from held
    sample_seconds: float = 0.0  # seconds spent getting this batch (waiting for replies, or sampling locally)
    origin: Any = None  # what the source needs to give the values back (reply views, sampled ids)


@dataclass(frozen=True)
class SourceInputs:
    """What the learner loop hands its batch source (the source never holds the loop): the role's context, the
    loop's counters and clock (the source adds to them), the loop's random generator, the algorithm's device, train
    steps and transfer note, and what to keep going while the source waits for messages."""

    ctx: RoleContext
    counters: Counters
    clock: Clock
    rng: np.random.Generator
    device: torch.device  # where the algorithm trains (a frame cache keeps its frames there)
    steps: Callable[[], int]  # the algorithm's train steps so far (a skipped batch is none)
    transferred: Callable[[float], None]  # tell the algorithm the mean value (priority) a transfer brought
    pump_params: Callable[[], None]  # release the held parameter sends (the emulated link)
    serve: Callable[[], bool] | None = None  # a turn of the worker on this rank: True when it answered a pass
    # With no buffer ranks (the actors send to the learner): the buffer loop to run in this process, over the
    # algorithm's server (a :class:`mpirl.actor_learner.replay_buffer.Buffer`).
    intake: Callable[[], Any] | None = None

    @property
    def cfg(self) -> JobConfig:
        return self.ctx.cfg

    def serve_turn(self) -> bool:
        """A turn of the worker on this rank, when there is one; True when it answered a pass."""
        return self.serve is not None and self.serve()

    def idle(self, seconds: float) -> None:
        """Wait ``seconds`` (counted as communication), serving the actors meanwhile when the worker is here."""
        with self.clock.communicating():
            if self.serve is None:
                time.sleep(seconds)
                return
            end, backoff = time.perf_counter() + seconds, Backoff()
            while time.perf_counter() < end:
                if self.serve():
                    backoff.reset()
                else:
                    backoff.sleep()


class LocalReplay(Protocol):
    """The learner-side memory of :class:`LocalMemory`, made by the algorithm (its kind of replay)."""

    need: int  # samples it must hold before a batch is drawn

    @property
    def size(self) -> int: ...

    def clear(self) -> None: ...

    def add_dump(self, views: dict[str, np.ndarray], values: np.ndarray) -> None:
        """Add one buffer's dump (record views, with frames once when the dump has them) with its values."""

    def sample(self, rng: np.random.Generator) -> Batch: ...

    def give_back(self, batch: Batch, values: np.ndarray) -> None: ...


class Links(Protocol):
    """What the loop asks of a source's lines to where its experience waits (:class:`~mpirl.actor_learner.shard_links.
    ShardLinks` for the buffers; a source of an algorithm's own may have others)."""

    def resumed(self, actor_steps: dict[int, int]) -> None:
        """After the counters came from a checkpoint: the env steps count on from ``actor_steps``."""

    def open_tables(self, file: MetricsFile) -> None: ...

    def write_rows(self) -> None: ...

    def pump(self) -> None:
        """Release the held sends on the lines (the emulated link), while the loop waits on something else."""

    def link_bytes(self) -> dict:
        """``bytes_in``, ``bytes_in_raw``, ``bytes_out``, ``bytes_out_raw`` so far."""

    def close(self, train_steps: int) -> None:
        """The stop: goodbye, and every message in flight taken."""


class BatchSource(Protocol):
    """Where the loop's batches come from and where their new values go."""

    @property
    def links(self) -> Links:
        """The lines to where the experience waits and what they tell (env steps, episodes, tables)."""

    def start(self) -> None:
        """Before the first batch (after the first parameter broadcast)."""

    def next_batch(self) -> Batch | None:
        """A batch, or None when none is ready yet (the loop logs, then calls :meth:`wait`)."""

    def wait(self) -> None:
        """Wait a little for the next batch (counted as communication)."""

    def give_back(self, batch: Batch, values: np.ndarray) -> None: ...

    def settle(self) -> None:
        """Bring the per-shard counts up to the last batch (before a checkpoint and at the stop)."""


def _shard_links(given: SourceInputs, sampled: bool) -> ShardLinks:
    """The lines to the buffers: replies are sampled shares (``prefetch + 1`` in flight) or whole dumps."""
    cfg, spec, n_buf = given.cfg, given.ctx.spec, len(given.ctx.topo.buffers)
    most = max_quota(cfg.replay.batch_size, n_buf, cfg.replay.shares)
    framed = framed_fields(spec) if cfg.replay.dedup_frames else {}
    reply = (sample_layout(spec, most, framed, cache=bool(cache_slots(cfg.replay.frame_cache, cfg.replay.capacity,
                                                                      framed)),
                           episodes=episode_slots(cfg.run.return_window)) if sampled
             else dump_layout(spec, cfg.replay.capacity, framed))
    return ShardLinks(given.ctx, given.counters, reply, most, cfg.comm.prefetch + 1 if sampled else 1)


class RemoteShards:
    """Batches sampled by the buffers, each its share; the values go back in the next request. With the learner's
    frame cache (``replay.frame_cache``, frames once) the replies carry only the frames it does not hold."""

    def __init__(self, given: SourceInputs):
        self.given, self.cfg = given, given.cfg
        self.links = _shard_links(given, sampled=True)
        counted = self.links.links[0].reply.counted
        self.cache = None
        if "frame_slots" in counted:
            shape, _, most = counted["frames"]
            slots = cache_slots(self.cfg.replay.frame_cache, self.cfg.replay.capacity,
                                framed_fields(given.ctx.spec))
            self.cache = FrameCache(len(self.links.links), slots, most * len(self.links.links), shape, given.device)
            self.links.cache = self.cache
        self.backoff = Backoff()
        self.served = False
        self.waited = 0.0  # seconds spent polling for the replies of the next batch

    def start(self) -> None:
        links, c = self.links, self.given.counters
        with self.given.clock.communicating():
            for _ in range(self.cfg.comm.prefetch + 1):
                for b, link in enumerate(links.links):  # a resumed run's counts continue, never back to 0
                    link.request(SAMPLE, links.quotas[b], consumed=c.consumed[b])

    def next_batch(self) -> Batch | None:
        given = self.given
        self.served = given.serve_turn()
        with given.clock.communicating():  # polling and taking the replies: all waiting on the link
            t = time.perf_counter()
            given.pump_params()
            ready = self.links.ready()
            self.waited += time.perf_counter() - t
            if ready:
                views = [self.links.take_reply(b) for b in range(len(self.links.links))]
        if not ready:
            return None
        self.backoff.reset()
        # A sample from buffer b was drawn with probability share_b / N * p_i / total_b;
        # importance weights use that and the total size over all shards.
        n = self.cfg.replay.batch_size
        # Shard b's share of the whole batch (with K learners, all K parts': this part's rows are fewer).
        shares = ([len(v["probs"]) for v in views] if self.links.learners == 1 else self.links.batch_quotas)
        probs = np.concatenate([v["probs"] * (share / n) for v, share in zip(views, shares)])
        prio = np.concatenate([v["priority"] for v in views])
        given.transferred(float(prio.mean()))
        fields = (joined(views, self.links.batch_fields) if self.cache is None
                  else self.cache.join(views, self.links.batch_fields))
        batch = Batch(fields, prio, probs, sum(self.links.sizes), sample_seconds=self.waited, origin=views)
        self.waited = 0.0
        return batch

    def wait(self) -> None:
        with self.given.clock.communicating():
            if self.served:
                self.backoff.reset()
            else:
                self.backoff.sleep()

    def give_back(self, batch: Batch, values: np.ndarray) -> None:
        links, c = self.links, self.given.counters
        with self.given.clock.communicating():
            if self.cfg.replay.shares == "rate":
                links.quotas = rate_quotas(self.cfg.replay.batch_size, [m.rate for m in links.meters])
            start = 0
            for b, link in enumerate(links.links):
                v = batch.origin[b]
                rows = len(v["ids"])
                c.consumed[b] += rows
                link.release()
                link.request(SAMPLE, links.quotas[b], consumed=c.consumed[b],
                             ids=v["ids"], versions=v["versions"], priority=values[start:start + rows])
                start += rows

    def settle(self) -> None:
        """Every batch's samples are counted as it goes back."""


class LocalMemory:
    """A local replay of the algorithm's kind, replaced with the buffers' dumps every ``replay.n_replay`` batches."""

    def __init__(self, given: SourceInputs, local_memory: Callable[[int, int], LocalReplay]):
        """``local_memory(capacity, rows)``: the algorithm's kind of replay (its ``local_memory``)."""
        self.given, self.cfg = given, given.cfg
        self.links = _shard_links(given, sampled=False)
        self.rows = sum(self.links.quotas)  # the batch, or this learner's part of it (K learners, each a copy)
        self.memory = local_memory(self.cfg.replay.capacity * len(self.links.links), self.rows)
        self.refreshed_at = given.steps()
        self.next_try = 0.0
        self.idling = False

    def start(self) -> None:
        self.refreshed_at = self.given.steps()

    def next_batch(self) -> Batch | None:
        given, memory = self.given, self.memory
        self.links.pump()
        given.pump_params()
        given.serve_turn()
        self.idling = memory.size < memory.need and time.perf_counter() < self.next_try
        if self.idling:
            return None  # waiting for the buffers to fill
        if given.steps() % self.cfg.replay.n_replay == 0 or memory.size < memory.need:
            self.refresh()
            if memory.size < memory.need:
                # Not enough yet: ask again when the buffers' insertion rate says there will be,
                # instead of shipping the whole (possibly GB-sized) memory again and again.
                rate = self.links.insertion_rate()
                wait = (memory.need - memory.size) / rate if rate > 0 else 0.2
                self.next_try = time.perf_counter() + min(max(wait, 0.05), 5.0)
                return None
        with given.clock.computing():
            t = time.perf_counter()
            batch = memory.sample(given.rng)
            batch.sample_seconds = time.perf_counter() - t
        return batch

    def wait(self) -> None:
        if self.idling:
            self.given.idle(0.01)

    def give_back(self, batch: Batch, values: np.ndarray) -> None:
        with self.given.clock.computing():
            self.memory.give_back(batch, values)

    def settle(self) -> None:
        """The batches since the last refresh sampled the memory the last dumps made; attribute them to each shard
        by its share of it. Counts only grow (a resumed run starts from its checkpoint's)."""
        steps, sizes, c = self.given.steps(), self.links.sizes, self.given.counters
        trained = (steps - self.refreshed_at) * self.rows
        total = sum(sizes)
        if trained and total:
            upto = trained * np.cumsum(sizes) // total  # shares that add up to `trained` exactly
            for b, share in enumerate(np.diff(upto, prepend=0)):
                c.consumed[b] += int(share)
            self.refreshed_at = steps

    def _replies_ready(self) -> bool:
        self.given.serve_turn()
        self.given.pump_params()
        return self.links.ready()

    def refresh(self) -> None:
        """Replace the local replay with every buffer's latest experiences.

        The transfer counts as communication, rebuilding the local memory as compute.
        """
        given, links, memory = self.given, self.links, self.memory
        self.settle()
        with given.clock.communicating():
            for b, link in enumerate(links.links):
                link.request(DUMP, 0, consumed=given.counters.consumed[b])
            wait_until(self._replies_ready)
            dumps = [links.take_reply(b) for b in range(len(links.links))]
        with given.clock.computing():
            memory.clear()
            priorities = [v.pop("priority") for v in dumps]
            for v, prio in zip(dumps, priorities):
                if len(prio):
                    memory.add_dump(v, prio)
            if memory.size:
                given.transferred(float(np.concatenate(priorities).mean()))
        for link in links.links:
            link.release()
