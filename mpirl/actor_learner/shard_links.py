"""The learner's lines to the buffers and what their replies tell it: env steps, shard sizes, insertion rates,
episodes, and the samples trained on per shard (the ``shards`` table).

Both replay sources of :mod:`mpirl.actor_learner.learner` talk to the buffers through this: the remote shards with
``prefetch + 1`` sample requests in flight per buffer, the local memory with one dump request at a time.
"""

from __future__ import annotations

import time

import numpy as np

from mpirl.comm.buffer_link import BufferLink
from mpirl.comm.codec import codec_for
from mpirl.comm.layout import Layout
from mpirl.comm.link import shaper_for
from mpirl.comm.messages import BYE, request_layout
from mpirl.metrics.writer import MetricsFile
from mpirl.replay.frame_cache import FrameCache
from mpirl.replay.quotas import RateMeter, even_quotas, learner_quotas
from mpirl.job.context import RoleContext
from mpirl.actor_learner.counters import Counters

F8, I8 = np.float64, np.int64


def batch_fields(reply: Layout) -> list[str]:
    """A batch's record fields as a reply carries them: with frames once, stacks as indices into ``frames``."""
    return [name for name in reply.fields if name not in ("ids", "versions", "probs", "priority")] + list(reply.counted)


def joined(views: list[dict], names: list[str]) -> dict[str, np.ndarray]:
    """One batch from every buffer's share: fields concatenated; with frames once, the frames too, and each
    share's ``<name>_idx`` moved past the frames of the shares before it."""
    if len(views) == 1:
        return {name: views[0][name] for name in names}
    out = {name: np.concatenate([v[name] for v in views]) for name in names if not name.endswith("_idx")}
    if "frames" in names:  # frame indices exist only with frames
        offsets = np.cumsum([0] + [len(v["frames"]) for v in views[:-1]])
        for name in names:
            if name.endswith("_idx"):
                out[name] = np.concatenate([v[name] + off for v, off in zip(views, offsets)])
    return out


class ShardLinks:
    """One request/reply line per buffer (learner-side rank b + 1 on the learner communicator) and the counters
    its replies carry."""

    def __init__(self, ctx: RoleContext, counters: Counters, reply: Layout, most: int, depth: int):
        cfg, topo = ctx.cfg, ctx.topo
        self.ctx, self.counters = ctx, counters
        n_buf = len(topo.buffers)
        # On the learner communicator the learners come first (K data-parallel learners), then the buffers.
        self.learners = topo.layout.count("learner")
        self.index = topo.learner.rank  # this learner's among them
        self.links = [BufferLink(topo.learner, self.learners + b, request_layout(most), reply, depth,
                                 shaper=shaper_for(cfg.comm.link), codec=codec_for(cfg.comm.link),
                                 chunk_bytes=int(cfg.comm.max_message_mb * 2**20)) for b in range(n_buf)]
        # A batch's record fields as replies carry them: with frames once, stacks as indices into "frames".
        self.batch_fields = batch_fields(reply)
        # Samples per shard in the whole batch, and in this learner's part of it (the next request's).
        self.batch_quotas = even_quotas(cfg.replay.batch_size, n_buf)
        self.quotas = (self.batch_quotas if self.learners == 1
                       else learner_quotas(self.batch_quotas, self.learners)[self.index])
        self.meters = [RateMeter() for _ in range(n_buf)]  # each shard's insertion rate
        self.sizes = [0] * n_buf
        # What each buffer's env steps add to its count: after a resume its actors count on from their last
        # metrics rows before the checkpoint (up to a log interval old), the learner from the checkpoint's count.
        self.env_offset = [0] * n_buf
        self.cache: FrameCache | None = None  # the learner's frame cache, when its source keeps one

    def resumed(self, actor_steps: dict[int, int]) -> None:
        """After the counters came from a checkpoint: each buffer's env steps continue from their count
        (``actor_steps``: each actor's env steps at the checkpoint)."""
        ctx = self.ctx
        for b, rank in enumerate(ctx.topo.buffers):
            resumed = sum(actor_steps.get(a, 0) for a in ctx.topo.actors_of(rank))
            self.env_offset[b] = self.counters.env_steps[b] - resumed

    def take_reply(self, b: int) -> dict[str, np.ndarray]:
        """The oldest reply of buffer ``b``: note its counters and episodes, return its record views."""
        link, c = self.links[b], self.counters
        buf = link.take()
        lay = link.reply
        c.env_steps[b] = int(lay.get(buf, "env_steps")) + self.env_offset[b]
        self.sizes[b] = int(lay.get(buf, "shard_size"))
        self.meters[b].update(time.perf_counter(), int(lay.get(buf, "inserted")))
        c.episodes += int(lay.get(buf, "episodes"))  # every episode since its last reply; the latest returns
        c.returns.extend(lay.get(buf, "ep_return")[:int(lay.get(buf, "returns"))].tolist())
        return lay.views(buf)

    def ready(self) -> bool:
        """True when every buffer's oldest reply has arrived."""
        return all([link.progress() for link in self.links])

    def pump(self) -> None:
        for link in self.links:
            link.sends.pump()

    def link_bytes(self) -> dict:
        """Bytes of batches and dumps in, requests with priorities out: on the wire and before compression."""
        links = self.links
        return {"bytes_in": sum(link.bytes_received for link in links),
                "bytes_in_raw": sum(link.raw_bytes_received for link in links),
                "bytes_out": sum(link.sends.bytes_sent for link in links),
                "bytes_out_raw": sum(link.sends.raw_bytes_sent for link in links)}

    def insertion_rate(self) -> float:
        return float(np.nansum([m.rate for m in self.meters]))

    # -- the shards table: one row per buffer per interval ---------------------------
    def open_tables(self, file: MetricsFile) -> None:
        # With the frame cache: per buffer the distinct frames of its batches the learner held (hits), those it
        # sent (misses), and the bytes the hits kept off the link, since the run (or its resume) began.
        cache = {"cache_hits": I8, "cache_misses": I8, "cache_bytes_saved": I8} if self.cache is not None else {}
        self.shard_table = file.table("shards", {
            "time": F8, "buffer": I8, "quota": I8, "size": I8, "inserted_per_s": F8, "consumed": I8, **cache})
        if self.ctx.resume:
            self.shard_table.truncate(self.shard_table.rows_until("time", self.ctx.resume.job_time))

    def write_rows(self) -> None:
        """Per shard: the quota asked for, its size, insertion rate and the samples trained on."""
        n = len(self.sizes)
        self.shard_table.extend(time=np.full(n, self.ctx.now()), buffer=np.array(self.ctx.topo.buffers),
                                quota=np.array(self.quotas), size=np.array(self.sizes),
                                inserted_per_s=np.array([m.rate for m in self.meters]),
                                consumed=np.array(self.counters.consumed), **self._cache_columns())

    def _cache_columns(self) -> dict:
        c = self.cache
        if c is None:
            return {}
        return {"cache_hits": c.hits.copy(), "cache_misses": c.misses.copy(), "cache_bytes_saved": c.bytes_saved()}

    def close(self, train_steps: int) -> None:
        """Goodbye to every buffer (with the final counts), then drain every reply."""
        for b, link in enumerate(self.links):
            link.request(BYE, 0, consumed=self.counters.consumed[b], train_steps=train_steps)
        for link in self.links:
            link.close()
