"""What an actor of a replay-based algorithm ships: staged records, packed into a ring of send buffers.

:class:`Staging` holds records waiting to be sent (one preallocated array per field of the record
spec, rows put in spec order); :class:`ExperienceSender` packs a batch of them with their priorities,
the actor's counters and its finished episodes into the experience layout and sends it to the buffer
with ``Isend``. Ape-X stages n-step transitions, QMIX whole episodes.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from mpirl.comm.layout import Layout
from mpirl.comm.messages import EPISODE_SLOTS, TAG_EXPERIENCE, experience_layout
from mpirl.comm.pools import SendRing
from mpirl.replay.frame_stream import FrameStream, FrameWindows


class Staging:
    """Transitions waiting to be sent: one preallocated array per field."""

    def __init__(self, spec: dict, rows: int):
        self.fields = {name: np.zeros((rows, *shape), dtype) for name, (shape, dtype) in spec.items()}
        self.count = 0

    def put(self, row: tuple) -> None:
        """One record, its fields in the spec's order."""
        for arr, value in zip(self.fields.values(), row):
            arr[self.count] = value
        self.count += 1

    def take(self, n: int) -> dict:
        """Views of the first ``n`` rows (valid until ``drop(n)``)."""
        return {name: arr[:n] for name, arr in self.fields.items()}

    def drop(self, n: int) -> None:
        """Forget the first ``n`` rows, moving the rest to the front."""
        rest = self.count - n
        if rest:
            for arr in self.fields.values():
                arr[:rest] = arr[n:self.count]
        self.count = rest


class ExperiencePacker:
    """Packs an actor's messages into the experience layout (no MPI: :class:`ExperienceSender` sends them).

    With ``frames`` (a :class:`~mpirl.replay.frame_stream.FrameStream`; the spec's frame stacks are
    ``framed``) the records carry frame ids, and each message carries the frames made since the last.
    """

    def __init__(self, spec: dict, send_batch: int, rank: int, frames: FrameStream | None = None,
                 framed: dict | None = None):
        self.frames = frames
        games = len(frames.stacks) if frames is not None else 1
        self.layout = experience_layout(spec, send_batch, framed if frames is not None else None, games)
        self.rank = rank

    @property
    def frames_due(self) -> bool:
        """Enough frames wait that the next step might not fit into one message: send now."""
        f = self.frames
        return f is not None and f.pending + len(f.stacks) * (f.depth + 1) > self.layout.counted["frames"][2]

    def pack(self, buf: np.ndarray, records: dict, priorities: np.ndarray, episodes: deque, final: bool = False,
             oldest: int = 0, **header) -> int:
        """``records`` with their priorities and up to EPISODE_SLOTS finished episodes; returns the bytes.

        With frames once: also every frame made since the last message; ``oldest`` is the oldest
        frame a later message may still refer to."""
        k = min(len(episodes), EPISODE_SLOTS)
        done_eps = [episodes.popleft() for _ in range(k)]
        if self.frames is not None:
            header.update(frames_rows=self.frames.pending, frame_games_rows=self.frames.pending, oldest_frame=oldest)
        nbytes = self.layout.pack(buf, {**records, "priority": priorities}, actor=self.rank, final=int(final),
                                  episodes=k, ep_return=[r for r, _ in done_eps], ep_length=[n for _, n in done_eps],
                                  **header)
        if self.frames is not None:
            views = self.layout.views(buf)
            self.layout.set(buf, first_frame=self.frames.copy_pending(views["frames"], views["frame_games"]))
            self.frames.sent_upto(oldest)
        return nbytes


class ExperienceSender(ExperiencePacker):
    """An actor's line to its buffer: batches packed into a ring of send buffers, ``Isend``."""

    def __init__(self, comm, spec: dict, send_batch: int, ring_size: int, rank: int,
                 frames: FrameStream | None = None, framed: dict | None = None):
        super().__init__(spec, send_batch, rank, frames, framed)
        self.ring = SendRing(comm, dest=0, tag=TAG_EXPERIENCE, nbytes=self.layout.max_nbytes, size=ring_size)
        self.sent = 0

    def send(self, records: dict, priorities: np.ndarray, episodes: deque, final: bool = False, oldest: int = 0,
             **header) -> None:
        """Pack (see :meth:`ExperiencePacker.pack`) and send."""
        slot, buf = self.ring.acquire()
        self.ring.send(slot, self.pack(buf, records, priorities, episodes, final, oldest, **header))
        self.sent += len(priorities)

    def close(self) -> None:
        self.ring.close()


def store_experience(store, layout: Layout, buf: np.ndarray, prioritized: bool, windows: FrameWindows | None = None,
                     framed: dict | None = None) -> int:
    """Add one experience message's records to ``store`` (a memory with ``add``; with frames once also
    ``add_indexed``, its frames joining the sender's window in ``windows``); returns the rows.

    A ``prioritized`` memory gets the message's priorities as its priorities; any other keeps them as
    the ``priority`` field of its records (the baseline's relay)."""
    rows = layout.rows(buf)
    views = layout.views(buf, rows)
    if windows is None or framed is None:
        if rows:
            store.add(views, views.pop("priority")) if prioritized else store.add(views)
        return rows
    sender = int(layout.get(buf, "actor"))
    windows.receive(sender, int(layout.get(buf, "first_frame")), views.pop("frames"), views.pop("frame_games"))
    if rows:
        idx = {name: windows.lookup(sender, views.pop(f"{name}_fid")) for name in framed}
        store.add_indexed(views, idx, views.pop("priority")) if prioritized else store.add_indexed(views, idx)
    if layout.get(buf, "final"):
        windows.close(sender)
    else:
        windows.forget(sender, int(layout.get(buf, "oldest_frame")))
    return rows


def oldest_frame(frames: FrameStream, staging: Staging, sent: int, windows) -> int:
    """The oldest frame a later message may refer to, once the first ``sent`` staged rows are sent: the
    rest of the staging, the n-step ``windows`` (their pending steps' stacks) and the games' stacks."""
    staged = [f[sent:staging.count, 0] for name, f in staging.fields.items() if name.endswith("_fid")]
    pending = np.array([w.oldest_obs()[0] for w in windows if len(w)], dtype=np.int64)
    return frames.oldest(pending, *staged)
