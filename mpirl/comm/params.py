"""Versioned parameters from one root to the members of a communicator, with the stop flag inside.

One message: ``int64[2]`` header (version, stop) followed by the flat float32
parameters. The root starts an ``Ibcast`` every time it publishes; every other
member keeps exactly one ``Ibcast`` posted and re-posts it after each arrival,
so all members join every broadcast in the same order. The broadcast that
carries ``stop=1`` is the last one on the communicator: nobody re-posts after
it, so shutdown never leaves a rank waiting in a collective.

With a link shaper the root holds each broadcast until its emulated arrival
time (``pump()`` starts it), so parameters pay the long-haul link too.

A broadcast moves at the pace of its slowest member: a member that enters MPI
rarely (an actor slowed down, polling once per message it sends) holds the
root's next broadcast, and with it every other member, back. Where members run
at their own pace (IMPALA's asynchronous actors) the layout declares the link
``each`` and :class:`ParamSends` sends to each member on its own instead: the
same versions in the same order, the newest when a member's last one has
arrived, nobody waiting for anyone. :func:`param_channel` picks.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from mpirl.comm.backoff import wait_until
from mpirl.comm.link import LinkShaper

HEADER_BYTES = 16
TAG_PARAMS = 17  # ParamSends' point-to-point messages


class ParamBroadcast:
    """Broadcast of ``n_params`` float32 values over ``comm`` from rank ``root``."""

    def __init__(self, comm: MPI.Comm, n_params: int, root: int = 0, shaper: LinkShaper | None = None):
        self.comm, self.root = comm, root
        self.shaper = shaper
        self.release_at: float | None = None  # a shaped broadcast waiting for its arrival time
        self.buf = np.zeros(HEADER_BYTES + 4 * n_params, dtype=np.uint8)
        self.header = self.buf[:HEADER_BYTES].view(np.int64)
        self.params = self.buf[HEADER_BYTES:].view(np.float32)
        self.request = MPI.REQUEST_NULL
        self.is_root = comm.rank == root
        self.closed = False
        self.broadcasts = 0

    @property
    def version(self) -> int:
        return int(self.header[0])

    @property
    def stop(self) -> bool:
        return bool(self.header[1])

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes

    def _start(self) -> None:
        self.request = self.comm.Ibcast([self.buf, MPI.BYTE], root=self.root)

    def done(self) -> bool:
        """True when no broadcast is held or in flight (the buffer may be read or rewritten)."""
        if self.pump():
            return False
        if self.request == MPI.REQUEST_NULL:
            return True
        return self.request.Test()

    def pump(self) -> bool:
        """Start a held broadcast whose emulated arrival time has come; True while one is held."""
        if self.release_at is not None and time.perf_counter() >= self.release_at:
            self.release_at = None
            self._start()
        return self.release_at is not None

    # -- root side -------------------------------------------------------------
    def publish(self, version: int, params: np.ndarray | None, stop: bool = False, timer=None) -> None:
        """Start broadcasting; waits (polling) for the previous broadcast to finish first."""
        assert self.is_root and not self.closed
        wait_until(self.done, timer=timer)
        self.header[:] = (version, int(stop))
        if params is not None:
            self.params[:] = params
        if self.shaper is None:
            self._start()
        else:
            self.release_at = self.shaper.release_time(self.buf.nbytes)
            self.pump()
        self.broadcasts += 1
        self.closed = stop

    # -- receiving side --------------------------------------------------------
    def post(self) -> None:
        """Post the receive for the next broadcast."""
        assert not self.is_root and self.request == MPI.REQUEST_NULL
        self._start()

    def arrived(self) -> bool:
        """True once per completed broadcast; re-post with ``post()`` unless ``stop``."""
        if self.request == MPI.REQUEST_NULL or not self.request.Test():
            return False
        self.request = MPI.REQUEST_NULL
        self.broadcasts += 1
        if self.stop:
            self.closed = True
        return True

    def close(self) -> None:
        """Complete the last broadcast (root) before the communicator goes away."""
        wait_until(self.done)

    @property
    def bytes_sent(self) -> int:
        """What the root has sent (a broadcast counted once, as the tree of the MPI library spreads it)."""
        return self.broadcasts * self.nbytes


class ParamSends(ParamBroadcast):
    """The versioned parameters sent to each member of ``comm`` on its own: ``publish`` makes them the newest and
    sends them to every member whose last send has completed; ``pump()`` (the root's loop) sends the newest to the
    others as theirs complete. A member sees versions in order, skipping those published while its last was still
    on the way; the stop is the last thing each member receives. The member's side is the broadcast's
    (``post``/``arrived``), with a receive for a broadcast."""

    def __init__(self, comm: MPI.Comm, n_params: int, root: int = 0):
        super().__init__(comm, n_params, root)
        members = [r for r in range(comm.size) if r != root] if self.is_root else []
        self.out = {m: np.zeros_like(self.buf) for m in members}  # each member's copy while its send is in flight
        self.sends = dict.fromkeys(members, MPI.REQUEST_NULL)
        self.due: set[int] = set()  # members the newest parameters have not been sent to yet
        self.sent = 0  # messages sent

    def _start(self) -> None:  # a member's receive
        self.request = self.comm.Irecv([self.buf, MPI.BYTE], self.root, TAG_PARAMS)

    def pump(self) -> bool:
        """Send the newest parameters to each member due them whose last send has completed; True while any is
        still due. The sends are synchronous (``Issend``: complete once the member's receive took them), so a
        member that does not look has one message waiting for it, never a backlog of buffered ones."""
        for m in sorted(self.due):
            if self.sends[m].Test():
                self.out[m][:] = self.buf
                self.sends[m] = self.comm.Issend([self.out[m], MPI.BYTE], m, TAG_PARAMS)
                self.due.discard(m)
                self.sent += 1
        return bool(self.due)

    def done(self) -> bool:
        return not self.pump() and all([r.Test() for r in self.sends.values()])

    def publish(self, version: int, params: np.ndarray | None, stop: bool = False, timer=None) -> None:
        """The newest parameters, to every member as soon as its last send has completed (never waits)."""
        assert self.is_root and not self.closed
        self.header[:] = (version, int(stop))
        if params is not None:
            self.params[:] = params
        self.due = set(self.sends)
        self.pump()
        self.broadcasts += 1
        self.closed = stop

    @property
    def bytes_sent(self) -> int:
        return self.sent * self.nbytes


def param_channel(comm: MPI.Comm, n_params: int, each: bool, shaper: LinkShaper | None = None):
    """The parameters' way over ``comm``: a broadcast, or (``each``) a send to each member on its own."""
    if each:
        if shaper is not None:
            raise ValueError("a shaped link broadcasts: ParamSends has no shaper")
        return ParamSends(comm, n_params)
    return ParamBroadcast(comm, n_params, shaper=shaper)


class ParamFollower:
    """A member's side of the broadcast, as every actor and worker runs it: ``start()`` waits for the first
    broadcast, ``poll()`` takes a newer one between steps; each is loaded with ``load(params)`` and re-posted,
    except the one with the stop, after which ``stopped`` is true and nothing is posted again."""

    def __init__(self, broadcast: ParamBroadcast, load):
        self.broadcast, self.load = broadcast, load
        self.version = -1  # the version loaded (-1: none yet)
        self.first = -1  # the first version received (1, or a resumed learner's)
        self.stopped = False

    def start(self) -> None:
        b = self.broadcast
        b.post()
        wait_until(b.arrived, first=1e-4, longest=10e-3)
        self.first = b.version
        self._take()

    def poll(self) -> bool:
        """True when a broadcast arrived (loaded, or the stop)."""
        if not self.broadcast.arrived():
            return False
        self._take()
        return True

    def _take(self) -> None:
        b = self.broadcast
        if b.stop:
            self.stopped = True
            return
        self.load(b.params)
        self.version = b.version
        b.post()
