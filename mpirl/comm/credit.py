"""Credit from the receiver: how many records each sender may have sent in all (``TAG_CREDIT``).

A receiver that holds its senders back by the room it has left (a bounded queue) tells each of them a
cumulative allowance, one ``int64`` on the senders' communicator: ``sent + staged < granted`` lets a sender go on.
A grant is a total, never an increment, so only the newest matters: :class:`CreditGrants` keeps at most one send
per sender in flight (``Issend``: complete once received, so a sender that does not look has one grant waiting,
never a backlog of buffered ones) and sends the newest total when the last has completed. After a sender's final
message the receiver closes its line with ``-1``; :meth:`CreditLine.close` waits for it, so every grant sent is received and
no receive is left posted (MPI keeps one sender's messages in order: the ``-1`` comes last).

:class:`CreditLine` is the sender's side: one ``Irecv`` posted, tested only when the sender has used what it was
granted (a sender with credit left never touches MPI for it).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from mpirl.comm.backoff import wait_until

TAG_CREDIT = 16
CLOSED = -1


class CreditLine:
    """A sender's allowance from ``root`` on ``comm``: ``granted`` records in all, starting at ``initial``."""

    def __init__(self, comm: MPI.Comm, initial: int, root: int = 0):
        self.comm, self.root = comm, root
        self.granted, self.closed = int(initial), False
        self.buf = np.zeros(1, np.int64)
        self.request = comm.Irecv([self.buf, MPI.INT64_T], root, TAG_CREDIT)

    def poll(self) -> bool:
        """Take every grant that has arrived; True if the allowance grew."""
        grew = False
        while not self.closed and self.request.Test():
            value = int(self.buf[0])
            if value == CLOSED:
                self.closed, self.request = True, MPI.REQUEST_NULL
                break
            grew = grew or value > self.granted
            self.granted = max(self.granted, value)
            self.request = self.comm.Irecv([self.buf, MPI.INT64_T], self.root, TAG_CREDIT)
        return grew

    def over(self, used: int) -> bool:
        """Has the sender used its allowance (``used``: records sent and staged)? Looks for a grant only then."""
        return used >= self.granted and (not self.poll() or used >= self.granted)

    def close(self) -> None:
        """After the sender's final message: take the grants still coming, up to the receiver's ``-1``."""
        def closed() -> bool:
            self.poll()
            return self.closed
        wait_until(closed, first=1e-4, longest=10e-3)


class CreditGrants:
    """A receiver's side: the newest total for each sender (group ranks ``senders``), sent as earlier sends
    complete; ``close(sender)`` after its final message, ``flush()`` in the receiver's loop."""

    def __init__(self, comm: MPI.Comm, senders: list[int]):
        self.comm = comm
        self.bufs = {s: np.zeros(1, np.int64) for s in senders}
        self.requests = {s: MPI.REQUEST_NULL for s in senders}
        self.due: dict[int, int] = {}  # sender -> the total not yet sent (CLOSED: the closing word)
        self.closing: set[int] = set()

    def grant(self, sender: int, total: int) -> None:
        if sender not in self.closing:
            self.due[sender] = int(total)

    def close(self, sender: int) -> None:
        """The sender's final message came: its line ends with ``-1`` after any grant already sent."""
        self.closing.add(sender)
        self.due[sender] = CLOSED

    def flush(self) -> bool:
        """Send each due total whose sender's previous send has completed; True if any went."""
        went = False
        for sender in list(self.due):
            req = self.requests[sender]
            if req != MPI.REQUEST_NULL and not req.Test():
                continue
            value = self.due.pop(sender)
            self.bufs[sender][0] = value
            self.requests[sender] = self.comm.Issend([self.bufs[sender], MPI.INT64_T], sender, TAG_CREDIT)
            went = True
        return went

    def finish(self) -> None:
        """Every sender closed (its final message came): send what is due and complete every send (each
        sender takes its grants up to its ``-1``)."""
        def sent() -> bool:
            self.flush()
            return not self.due and all([r.Test() for r in self.requests.values()])
        wait_until(sent)
