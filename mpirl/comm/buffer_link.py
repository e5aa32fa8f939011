"""The learner's line to one buffer: requests out, replies back in order.

A reply receive is posted *before* its request is sent, so replies never wait
in MPI's unexpected queue; because messages between two ranks on one tag do not
overtake each other, the k-th posted receive holds the k-th reply. ``depth``
reply buffers bound how many requests can be outstanding (prefetch + 1).
"""

from __future__ import annotations

from collections import deque

import numpy as np
from mpi4py import MPI

from mpirl.comm.backoff import wait_until
from mpirl.comm.codec import Codec
from mpirl.comm.layout import Layout
from mpirl.comm.link import LinkShaper
from mpirl.comm.messages import BYE, TAG_REPLY, TAG_REQUEST
from mpirl.comm.pools import SendRing, chunking, pieces


class BufferLink:
    def __init__(self, comm: MPI.Comm, dest: int, request: Layout, reply: Layout, depth: int,
                 shaper: LinkShaper | None = None, codec: Codec | None = None, chunk_bytes: int = 0):
        self.comm, self.dest = comm, dest
        self.req, self.reply = request, reply
        self.sends = SendRing(comm, dest, TAG_REQUEST, request.max_nbytes, depth + 1, shaper=shaper, codec=codec)
        self.buffers = [reply.buffer() for _ in range(depth)]
        self.codec = codec
        self.wire = [np.zeros(codec.bound(reply.max_nbytes), np.uint8) for _ in range(depth)] if codec else self.buffers
        self.bytes_received = self.raw_bytes_received = 0
        # Replies over MPI's 2 GiB message limit come as pieces (see comm.pools.chunking).
        self.n_pieces, self.piece = chunking(self.wire[0].nbytes, chunk_bytes)
        self.statuses = [MPI.Status() for _ in range(self.n_pieces)]
        self.free = list(range(depth))
        # [slot, request, bytes received or None] in the order the requests were sent
        self.outstanding: deque = deque()
        self.held: int | None = None
        self.seq = 0

    def request(self, kind: int, want: int, consumed: int, ids=None, versions=None, priority=None,
                train_steps: int = 0) -> None:
        """Send a request; SAMPLE and DUMP also post the receive for their reply.

        ``train_steps``: the learner's; a BYE's tells the buffer which stop checkpoint it belongs to.
        """
        if kind != BYE:
            if not self.free:
                raise RuntimeError("more requests outstanding than reply buffers (prefetch + 1)")
            slot = self.free.pop()
            wire = self.wire[slot]
            reqs = [self.comm.Irecv([piece, MPI.BYTE], self.dest, TAG_REPLY)
                    for piece in pieces(wire, wire.nbytes, self.n_pieces, self.piece)]
            self.outstanding.append([slot, reqs, None])
        records = {} if ids is None else {"ids": ids, "versions": versions, "priority": priority}
        s, buf = self.sends.acquire()
        nbytes = self.req.pack(buf, records, kind=kind, seq=self.seq, want=want, consumed=consumed,
                               train_steps=train_steps)
        self.sends.send(s, nbytes)
        self.seq += 1

    def ready(self) -> bool:
        """True when the oldest outstanding reply has arrived."""
        if not self.outstanding:
            return False
        head = self.outstanding[0]
        if head[2] is None and MPI.Request.Testall(head[1], self.statuses):
            head[2] = sum(st.Get_count(MPI.BYTE) for st in self.statuses)
        return head[2] is not None

    def progress(self) -> bool:
        """Release held requests (emulated link), then ``ready()``."""
        self.sends.pump()
        return self.ready()

    def take(self) -> np.ndarray:
        """The oldest reply (after ``ready()``), decompressed if need be. Hold it until ``release()``."""
        slot, _, nbytes = self.outstanding.popleft()
        self.held = slot
        self.bytes_received += nbytes
        if self.codec is not None:
            nbytes = self.codec.decompress_into(self.wire[slot][:nbytes], self.buffers[slot])
        self.raw_bytes_received += nbytes
        return self.buffers[slot]

    def release(self) -> None:
        """The held reply is no longer read: its buffer may receive again."""
        self.free.append(self.held)
        self.held = None

    def close(self) -> None:
        """Wait (polling) for every outstanding reply and request to complete."""
        while self.outstanding:
            wait_until(self.progress)
            self.take()
            self.release()
        self.sends.close()
