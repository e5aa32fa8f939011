"""Preallocated send rings and pre-posted receive pools (buffer-based MPI only).

A :class:`SendRing` owns a few byte buffers for one destination; a buffer is
handed out again only after ``Test`` says its ``Isend`` completed. With a
:class:`~mpirl.comm.link.LinkShaper` the ring holds each message until its
emulated arrival time; the owner calls ``pump()`` in its loop to release them.
With a :class:`~mpirl.comm.codec.Codec` both compress on the wire: ``bytes_*``
count wire bytes, ``raw_bytes_*`` the messages as packed. A
:class:`RecvPool` keeps ``depth`` receives posted per source; the owner handles
a completed buffer and then reposts it. Both count bytes, and both complete or
cancel every request in ``close()``.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
from mpi4py import MPI

from mpirl.comm.backoff import Backoff, wait_until
from mpirl.comm.codec import Codec
from mpirl.comm.link import LinkShaper


def chunking(buffer_nbytes: int, chunk_bytes: int) -> tuple[int, int]:
    """(pieces, bytes per piece) for messages held in a buffer of ``buffer_nbytes``.

    MPI counts are 32-bit: a message over 2 GiB (a baseline dump of 65,536 Atari
    experiences is 3.7 GB) goes as a fixed number of pieces of at most ``chunk_bytes``,
    the unused tail pieces empty. Sender and receiver derive the same number from the
    same buffer size, so the k-th posted receive always gets the k-th piece.
    """
    if chunk_bytes <= 0 or buffer_nbytes <= chunk_bytes:
        return 1, max(buffer_nbytes, 1)
    return -(-buffer_nbytes // chunk_bytes), chunk_bytes


def pieces(buf: np.ndarray, nbytes: int, n: int, size: int) -> list[np.ndarray]:
    """The ``n`` consecutive pieces of ``buf[:nbytes]`` (each ``size`` bytes, the last ones short or empty)."""
    return [buf[min(i * size, nbytes):min((i + 1) * size, nbytes)] for i in range(n)]


class SendRing:
    """``size`` send buffers of ``nbytes`` for messages to ``dest`` on ``comm`` with ``tag``."""

    def __init__(self, comm: MPI.Comm, dest: int, tag: int, nbytes: int, size: int,
                 shaper: LinkShaper | None = None, codec: Codec | None = None, chunk_bytes: int = 0):
        self.comm, self.dest, self.tag = comm, dest, tag
        self.buffers = [np.zeros(nbytes, dtype=np.uint8) for _ in range(size)]
        self.codec = codec
        self.wire = [np.zeros(codec.bound(nbytes), dtype=np.uint8) for _ in range(size)] if codec else self.buffers
        self.requests: list[list] = [[] for _ in range(size)]  # the pieces in flight, per buffer
        self.n_pieces, self.piece = chunking(self.wire[0].nbytes, chunk_bytes)
        self.shaper = shaper
        self.raw_bytes_sent = 0
        self.held: deque = deque()  # (release time, slot, nbytes) waiting for the emulated link
        self.busy = [False] * size
        self.bytes_sent = 0
        self.messages = 0
        self._next = 0

    def _free_slot(self) -> int | None:
        if self.held:
            self.pump()
        n = len(self.buffers)
        for k in range(n):
            i = (self._next + k) % n
            if not self.busy[i] and self._sent(i):
                return i
        return None

    def acquire(self) -> tuple[int, np.ndarray]:
        """A free buffer, waiting (with back-off) for an in-flight send to finish if needed."""
        slot = self._free_slot()
        if slot is None:
            backoff = Backoff()
            while slot is None:
                backoff.sleep()
                slot = self._free_slot()
        return slot, self.buffers[slot]

    def send(self, slot: int, nbytes: int) -> None:
        """Send the first ``nbytes`` of buffer ``slot`` (now, or when the emulated link delivers it).

        The buffer stays untouched until the send has completed.
        """
        self.raw_bytes_sent += nbytes
        if self.codec is not None:
            nbytes = self.codec.compress_into(self.buffers[slot][:nbytes], self.wire[slot])
        self.bytes_sent += nbytes
        self.messages += 1
        self._next = (slot + 1) % len(self.buffers)
        if self.shaper is None:
            self._isend(slot, nbytes)
        else:
            self.busy[slot] = True
            self.held.append((self.shaper.release_time(nbytes), slot, nbytes))
            self.pump()

    def _isend(self, slot: int, nbytes: int) -> None:
        if self.n_pieces == 1:  # the common case: one request, tested on its own (cheaper than Testall)
            self.requests[slot] = self.comm.Isend([self.wire[slot][:nbytes], MPI.BYTE], self.dest, self.tag)
        else:
            self.requests[slot] = [self.comm.Isend([piece, MPI.BYTE], self.dest, self.tag)
                                   for piece in pieces(self.wire[slot], nbytes, self.n_pieces, self.piece)]

    def _sent(self, slot: int) -> bool:
        req = self.requests[slot]
        if not req:  # nothing in flight (an empty list, or a completed request: MPI.REQUEST_NULL is falsy)
            return True
        if not (req.Test() if isinstance(req, MPI.Request) else MPI.Request.Testall(req)):
            return False
        self.requests[slot] = []
        return True

    def pump(self) -> bool:
        """Start the held sends whose emulated arrival time has come; True if any is still held."""
        if self.held:
            now = time.perf_counter()
            while self.held and self.held[0][0] <= now:
                _, slot, nbytes = self.held.popleft()
                self.busy[slot] = False
                self._isend(slot, nbytes)
        return bool(self.held)

    def close(self) -> None:
        """Wait (polling) until every held message is sent and every send has completed."""
        wait_until(lambda: not self.pump() and all([self._sent(i) for i in range(len(self.buffers))]))


class RecvPool:
    """``depth`` posted receives of up to ``nbytes`` from each of ``sources`` on ``comm``/``tag``.

    Messages from one source are handed out in the order it sent them: MPI matches them to the
    receives in the order these were posted, but a later receive may be seen complete first, and
    waits until the ones posted before it have been handed out (frames once relies on it).
    """

    def __init__(self, comm: MPI.Comm, sources: list[int], tag: int, nbytes: int, depth: int,
                 codec: Codec | None = None):
        self.comm, self.tag = comm, tag
        self.slots = [(src, np.zeros(nbytes, dtype=np.uint8)) for src in sources for _ in range(depth)]
        self.codec = codec
        self.wire = [np.zeros(codec.bound(nbytes), dtype=np.uint8) for _ in self.slots] if codec else None
        self.raw_bytes_received = 0
        self.requests = [MPI.REQUEST_NULL] * len(self.slots)
        self.statuses = [MPI.Status() for _ in self.slots]
        self.bytes_received = 0
        self.messages = 0
        self.posted = {src: deque() for src in sources}  # each source's posted receives, oldest first
        self.arrived: dict[int, int] = {}  # complete receives not handed out yet: slot -> bytes on the wire
        for i in range(len(self.slots)):
            self.post(i)

    def post(self, i: int) -> None:
        """(Re)post receive ``i``; call only after its last message has been handled."""
        src, buf = self.slots[i]
        target = buf if self.codec is None else self.wire[i]
        self.requests[i] = self.comm.Irecv([target, MPI.BYTE], src, self.tag)
        self.posted[src].append(i)

    def poll(self) -> list[tuple[int, int, np.ndarray, int]]:
        """Completed receives as ``(slot, source, buffer, raw nbytes)``, each source's in the order it sent them;
        repost each with ``post(slot)``."""
        statuses = self.statuses
        done = MPI.Request.Testsome(self.requests, statuses)
        if not done:
            return []
        arrived = self.arrived
        for j, i in enumerate(done):  # MPI fills the statuses in the order of the indices it returns
            arrived[i] = statuses[j].Get_count(MPI.BYTE)
        out = []
        for src in {self.slots[i][0] for i in done}:
            posted = self.posted[src]
            while posted and posted[0] in arrived:
                i = posted.popleft()
                nbytes = arrived.pop(i)
                self.bytes_received += nbytes
                self.messages += 1
                if self.codec is not None:
                    nbytes = self.codec.decompress_into(self.wire[i][:nbytes], self.slots[i][1])
                self.raw_bytes_received += nbytes
                out.append((i, src, self.slots[i][1], nbytes))
        return out

    def close(self) -> None:
        """Cancel every posted receive and complete it (cancelled or matched)."""
        for req in self.requests:
            if req != MPI.REQUEST_NULL:
                req.Cancel()
        MPI.Request.Waitall(self.requests)
        self.requests = [MPI.REQUEST_NULL] * len(self.slots)
