"""A hub: one rank that many peers exchange with, each peer sending a message and waiting for the hub's reply.

The shape of a Q-server or a parameter server. Each peer has one pre-posted receive of a declared maximum size
(a byte count or a :class:`~mpirl.comm.layout.Layout`) and one reply buffer; completed receives come out of
``Testsome`` in arrival order. A peer's message stays in its inbox, and its receive is not posted again, until
the hub answers it (:meth:`Hub.reply`), so whatever the owner reads from the inbox (zero-copy views) stays valid
while the message is handled, joined to a round or held. Two serving modes:

* ``"arrival"`` (asynchronous): the owner handles each message as :meth:`Hub.poll` returns it and replies.
* ``"rounds"`` (synchronous): the owner :meth:`Hub.join`\\ s each message to the current round; once every live
  peer is in (:meth:`Hub.round`), it handles the round's messages in rank order and replies to each, and the
  next round starts. A peer that finishes while the others wait no longer holds the round back.

A peer's last message is its owner's to recognise: :meth:`Hub.finish` retires the peer (no reply, no new
receive). :meth:`Hub.hold` leaves a message unanswered in its inbox until :meth:`Hub.release` hands the held
peers back in the order they were held: what a consistent cut needs when a peer that is already in the cut has
sent its next message. Replies are non-blocking sends; a peer's reply buffer is reused once its previous send has
completed (the peer has had that reply before it could send again), and :meth:`Hub.close` completes them all.

For an A3C-style parameter server: the peers are the workers, each message a flat float32 gradient after a small
header (the version it was computed at), ``nbytes`` the header plus ``4 * n_params``; the reply is the parameters
and their version, written into :meth:`Hub.outbox`. In ``"arrival"`` mode every gradient is applied as it comes
(Hogwild-like, each worker answered with the parameters after its own gradient); in ``"rounds"`` mode the round's
gradients are averaged in rank order (a deterministic synchronous step) and every worker gets the same parameters.

No algorithm here: what a message means, and when a peer has sent its last, are the owner's.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import numpy as np
from mpi4py import MPI

from mpirl.comm.backoff import wait_until
from mpirl.comm.layout import Layout

MODES = ("arrival", "rounds")
Item = TypeVar("Item")  # what the owner joins to a round with a message (its decoded form, say)


def _size(nbytes: int | Layout) -> int:
    return nbytes.max_nbytes if isinstance(nbytes, Layout) else int(nbytes)


class Hub(Generic[Item]):
    """``peers`` (ranks of ``comm``) send messages of up to ``nbytes`` with ``tag``; each is answered with a reply
    of up to ``reply_nbytes`` with ``reply_tag``. ``finished``: peers that have already sent their last (a resumed
    run); no receive is posted for them."""

    def __init__(self, comm: MPI.Comm, peers: list[int], tag: int, nbytes: int | Layout, reply_tag: int,
                 reply_nbytes: int | Layout, mode: str = "arrival", finished: set[int] | frozenset = frozenset()):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.comm, self.tag, self.reply_tag, self.mode = comm, tag, reply_tag, mode
        self.peers = list(peers)
        self.inboxes = [np.empty(_size(nbytes), np.uint8) for _ in self.peers]
        self.outboxes = [np.empty(_size(reply_nbytes), np.uint8) for _ in self.peers]
        self.position = {p: i for i, p in enumerate(self.peers)}
        self.done: set[int] = set(finished)  # peers that have sent their last message
        self.recvs = [MPI.REQUEST_NULL] * len(self.peers)
        self.statuses = [MPI.Status() for _ in self.peers]
        self.sends: dict[int, MPI.Request] = {}
        self.received = [0] * len(self.peers)  # bytes of each peer's message in its inbox
        self.held: list[int] = []
        self.joined: dict[int, Item] = {}  # rounds: the current round's peers (and what the owner joined)
        for p in self.peers:
            if p not in self.done:
                self._post(p)

    @property
    def live(self) -> list[int]:
        """The peers that have not sent their last message, in rank order as given."""
        return [p for p in self.peers if p not in self.done]

    def _post(self, peer: int) -> None:
        i = self.position[peer]
        self.recvs[i] = self.comm.Irecv([self.inboxes[i], MPI.BYTE], source=peer, tag=self.tag)

    def poll(self) -> list[int]:
        """The peers whose message has arrived since the last poll, in arrival order (one ``Testsome``; within it,
        in the order the peers were given). Each message is in :meth:`inbox` until the peer is answered."""
        done = MPI.Request.Testsome(self.recvs, self.statuses)
        if not done:
            return []
        for j, i in enumerate(done):  # MPI fills the statuses in the order of the indices it returns
            self.received[i] = self.statuses[j].Get_count(MPI.BYTE)
        return [self.peers[i] for i in done]

    def inbox(self, peer: int) -> np.ndarray:
        """``peer``'s buffer, holding its latest message (of :meth:`nbytes_in` bytes)."""
        return self.inboxes[self.position[peer]]

    def nbytes_in(self, peer: int) -> int:
        return self.received[self.position[peer]]

    def outbox(self, peer: int) -> np.ndarray:
        """``peer``'s reply buffer, free to write: its previous reply's send has completed."""
        send = self.sends.pop(peer, None)
        if send is not None:
            send.Wait()  # long done: the peer has had that reply before it sent the message answered now
        return self.outboxes[self.position[peer]]

    def reply(self, peer: int, nbytes: int) -> None:
        """Send the first ``nbytes`` of ``peer``'s :meth:`outbox` (non-blocking) and post its next receive."""
        i = self.position[peer]
        if peer in self.sends:
            raise RuntimeError(f"peer {peer}'s outbox was not taken through outbox() before this reply")
        self.sends[peer] = self.comm.Isend([self.outboxes[i][:nbytes], MPI.BYTE], dest=peer, tag=self.reply_tag)
        self._post(peer)

    def finish(self, peer: int) -> None:
        """``peer`` has sent its last message: it gets no reply and no new receive, and no round waits for it."""
        self.done.add(peer)

    def hold(self, peer: int) -> None:
        """Leave ``peer``'s message unanswered in its inbox until :meth:`release`."""
        self.held.append(peer)

    def release(self) -> list[int]:
        """The held peers, in the order they were held (their messages still in their inboxes); none held after."""
        out, self.held = self.held, []
        return out

    def join(self, peer: int, item: Item) -> None:
        """``"rounds"``: ``peer``'s message is in the current round; ``item`` is whatever the owner wants back
        with it (its decoded message, say)."""
        if self.mode != "rounds":
            raise RuntimeError("join() is for a hub serving in rounds")
        if peer in self.joined:
            raise RuntimeError(f"peer {peer} sent twice in one round")
        self.joined[peer] = item

    def round(self) -> dict[int, Item] | None:
        """``"rounds"``: once every live peer has joined, the round (peer -> item, in rank order as given), and the
        next round starts empty; None before then, or when no peer is live."""
        live = self.live
        if self.mode != "rounds" or not live or len(self.joined) != len(live):
            return None
        out = {p: self.joined[p] for p in live}
        self.joined = {}
        return out

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.peers)

    def close(self) -> None:
        """Complete every reply sent, and cancel the receives still posted (a peer that never sent its last)."""
        for send in self.sends.values():
            send.Wait()
        self.sends.clear()
        for req in self.recvs:
            if req != MPI.REQUEST_NULL:
                req.Cancel()
        MPI.Request.Waitall(self.recvs)
        self.recvs = [MPI.REQUEST_NULL] * len(self.peers)


def ask(comm: MPI.Comm, hub: int, message: np.ndarray, reply: np.ndarray, tag: int, reply_tag: int,
        first: float = 50e-6, longest: float = 5e-3) -> None:
    """A peer's exchange with the hub on rank ``hub``: send ``message`` (bytes) and wait, polling with back-off (no
    core held while the hub is busy with the others), until its reply is in ``reply`` and the send has completed."""
    send = comm.Isend([message, MPI.BYTE], dest=hub, tag=tag)
    recv = comm.Irecv([reply, MPI.BYTE], source=hub, tag=reply_tag)
    wait_until(lambda: recv.Test() and send.Test(), first=first, longest=longest)
