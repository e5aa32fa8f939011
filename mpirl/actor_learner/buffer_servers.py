"""What a buffer rank serves its learner from: a :class:`Server`, one class per placement of the replay memory
(an algorithm may bring its own, such as a trajectory queue: ``ActorLearnerBuilder.make_server``).

Both take the experiences the buffer loop (:mod:`mpirl.actor_learner.replay_buffer`) receives into ``memory``
and answer the learner through the ``reply`` layout, over a ring of ``depth`` send buffers:

* :class:`ShardServer` keeps the replay memory here (the algorithm's, made by its builder): a
  request first applies the priorities it carries (dropping those of slots refilled since they were
  sampled), then a batch is sampled straight into the reply buffer.
* :class:`Relay` keeps the latest ``capacity`` experiences with the priorities their actors gave them (as
  one more field of the records) and ships them all when the learner asks; the learner keeps the replay.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast

import numpy as np

from mpirl.comm.layout import Layout
from mpirl.comm.messages import dump_layout, episode_slots, sample_layout
from mpirl.config import JobConfig
from mpirl.replay.frame_cache import CacheMirror, cache_slots, settle_slots
from mpirl.replay.memory import ReplayMemory
from mpirl.replay.ring import RingStore

if TYPE_CHECKING:
    from mpirl.job.context import RoleContext


class Buffer(Protocol):
    """What a server reads of the buffer rank it serves from (:class:`mpirl.actor_learner.replay_buffer.Buffer`)."""
    ctx: RoleContext
    cfg: JobConfig
    spec: dict  # the record spec: field -> (shape, dtype)
    framed: dict  # the fields whose frames are stored once (empty without frame deduplication)
    min_fill: int  # records this shard holds before it serves a batch
    stream_frames: int  # frames the actors' streams may still refer to (ring room kept for them)
    n_actors: int  # the ranks that send experiences here (actors, or their workers)
    exp: Layout  # the experience messages' layout


class Server(ABC):
    """What a buffer serves its learner from. The buffer loop stores each sender's message in ``memory`` (records,
    and frames in ``ring``), answers each request with :meth:`fill` into a reply of the ``reply`` layout (``depth``
    of them in flight) and hands it what a request brings back (:meth:`feedback`); the hooks below let a server
    keep books of its own (a queue's credit to its senders)."""

    prioritized: bool  # experiences are stored with the priorities their senders gave
    memory: Any
    ring: RingStore | None  # where the frames are (frames once), if anywhere
    reply: Layout
    depth: int

    @abstractmethod
    def ready(self, want: int) -> bool:
        """A request for ``want`` records can be served now."""

    @abstractmethod
    def fill(self, buf: np.ndarray, want: int, rng: np.random.Generator) -> tuple[int, int]:
        """The reply to a request for ``want`` records, into ``buf``: (rows, frames sent)."""

    @abstractmethod
    def feedback(self, req: Layout, buf: np.ndarray, rows: int) -> tuple[int, int]:
        """What a request carries back (priorities): (stale, applied rows)."""

    @property
    @abstractmethod
    def total(self) -> float:
        """The memory's total priority, for the buffer's rows (NaN: none)."""

    @property
    @abstractmethod
    def reply_total(self) -> float:
        """The total priority each reply carries (the learner's shares of the shards)."""

    def arrived(self, source: int, rows: int, final: bool) -> None:
        """Sender ``source`` (its rank in the group) had ``rows`` records stored; ``final``: its goodbye."""

    def turn(self) -> bool:
        """A turn of the buffer's loop: anything of the server's own to do (True if it did something)."""
        return False

    def columns(self) -> dict:
        """Columns the server adds to its buffer's ``buffer`` table (name -> dtype)."""
        return {}

    def row(self) -> dict:
        """The values of :meth:`columns` for the row being written."""
        return {}

    def close(self) -> None:
        """Before the buffer closes its communicators: every sender has said goodbye."""


def placement_server(buffer: Buffer, share: int, make_memory: Callable[[], ReplayMemory]) -> Server:
    """The server of ``replay.architecture``: the algorithm's replay memory (``make_memory()``) served here in
    batches (proposed), or the latest records relayed whole to the learner's own memory (baseline)."""
    if buffer.cfg.replay.architecture == "proposed":
        return ShardServer(buffer, share, make_memory())
    return Relay(buffer, share)


class ShardServer(Server):
    """The replay memory on the buffer: serves sampled batches, takes priorities back."""

    prioritized = True  # experiences are added with their priorities

    def __init__(self, buffer: Buffer, share: int, memory: ReplayMemory) -> None:
        """``memory``: the algorithm's replay memory; with frames once its pool has room for
        ``buffer.stream_frames`` more frames."""
        self.memory = memory
        self.ring = cast(RingStore, self.memory.store)  # where the records (and frames) are
        cache = cache_slots(buffer.cfg.replay.frame_cache, buffer.cfg.replay.capacity, buffer.framed)
        # The learner's frame cache as this buffer knows it (none: every reply carries all its batch's frames).
        self.mirror = CacheMirror(cache) if cache else None
        self.reply = sample_layout(buffer.spec, share, buffer.framed, cache=bool(cache),
                                   episodes=episode_slots(buffer.cfg.run.return_window))
        self.depth = buffer.cfg.comm.prefetch + 1  # replies in flight: the learner's prefetch, and one more
        self.min_fill = buffer.min_fill

    def ready(self, want: int) -> bool:
        """A request can be served: the memory holds ``replay.learning_starts`` (its share)."""
        return self.memory.size >= self.min_fill

    def fill(self, buf: np.ndarray, want: int, rng: np.random.Generator) -> tuple[int, int]:
        """Sample ``want`` records straight into the reply buffer ``buf`` (none while the memory is empty, which
        happens only at shutdown): (rows, frames sent)."""
        rows = want if self.memory.size else 0
        counted = {name: most for name, (_, _, most) in self.reply.counted.items()}
        views = self.reply.views(buf, rows, **counted)
        if not rows:
            return 0, 0
        sent = self.memory.sample_into(rows, rng, views, self.mirror).frames
        if self.mirror is not None:
            settle_slots(self.reply, buf, rows, sent)
        return rows, sent

    def feedback(self, req: Layout, buf: np.ndarray, rows: int) -> tuple[int, int]:
        """The priorities a request carries back: (stale, applied rows)."""
        if not rows:
            return 0, 0
        v = req.views(buf, rows)
        return self.memory.update_priorities(v["ids"], v["versions"], v["priority"]), rows

    @property
    def total(self) -> float:
        """The memory's total priority (the buffer's rows)."""
        return self.memory.total

    @property
    def reply_total(self) -> float:
        """The memory's total priority, sent with each reply (the learner's shard shares)."""
        return self.memory.total


class Relay(Server):
    """The latest experiences with their actors' priorities, shipped whole to the learner's local memory."""

    prioritized = False  # the priorities are stored as the records' ``priority`` field

    def __init__(self, buffer: Buffer, share: int) -> None:
        rp = buffer.cfg.replay
        self.memory = RingStore({**buffer.spec, "priority": ((), np.dtype(np.float32))}, rp.capacity,
                                dedup_frames=rp.dedup_frames, stream_frames=buffer.stream_frames)
        self.ring = self.memory
        self.reply = dump_layout(buffer.spec, rp.capacity, buffer.framed)
        self.depth = 1

    def ready(self, want: int) -> bool:
        """A relay is asked for dumps only, answered as they come: no request waits on it."""
        return True

    def fill(self, buf: np.ndarray, want: int, rng: np.random.Generator) -> tuple[int, int]:
        """Every stored experience into the reply buffer ``buf``, oldest first (frames once: the distinct frames
        and the stacks as indices): (rows, distinct frames)."""
        rows, frames = self.memory.size, 0
        if self.reply.counted:
            views = self.reply.views(buf, rows, frames=self.reply.counted["frames"][2])
            rows, frames = self.memory.export_framed(views, views["frames"])
        else:
            self.memory.export(self.reply.views(buf, rows))
        return rows, frames

    def feedback(self, req: Layout, buf: np.ndarray, rows: int) -> tuple[int, int]:
        """No priorities come back to a relay."""
        return 0, 0

    @property
    def total(self) -> float:
        """No total priority here (NaN in the buffer's rows)."""
        return np.nan

    @property
    def reply_total(self) -> float:
        """0 in replies (a dump carries its priorities as records)."""
        return 0.0
