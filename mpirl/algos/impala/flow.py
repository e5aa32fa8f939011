"""How IMPALA's actors are held back by their queue, and how large a queue must be so nothing is ever dropped.

**Asynchronous exchange: a window per sender, granted by the queue.** Each of a queue's ``g`` senders may have
``window = ceil(replay.capacity / g)`` trajectories sent and not yet taken by the learner. The queue serves its
oldest trajectories first, so those the learner takes are those of the oldest messages: :class:`Windows` gives each
message's rows back to its sender as they are taken, and the queue tells the sender its new total
(:mod:`mpirl.comm.credit`). A sender stops while ``sent + staged >= window + its rows taken``. A fast sender gets its
room back as fast as the learner takes its trajectories, whatever the others do: a slow actor holds back only its
own window, never the fast one (an equal share of the learner's consumption, which this replaced, held the fast
actor to the slow one's pace). A sender starts one message on its last row of room, so a queue holds at most
``g * (window + message_rows)`` trajectories: :func:`queue_slots`.

**Synchronous rounds** keep the version's arithmetic (:func:`queue_budget`): one message per actor and version, so
every actor acts each round with the parameters the last round made.

With inference workers the senders are the workers (``g`` counts them, a message holds their actors' games).
"""

from __future__ import annotations

import math
from collections import deque

from mpirl.algos.impala.settings import fresh_batch
from mpirl.comm.credit import CreditLine
from mpirl.replay.ratio import InsertBudget


def window(cfg, group: int) -> int:
    """Trajectories one of a queue's ``group`` senders may have in it (sent, not yet taken)."""
    return math.ceil(cfg.replay.capacity / max(group, 1))


def queue_budget(cfg, n_actors: int, buffers: int, group: int) -> InsertBudget:
    """A synchronous round's allowance: one message per version, so an actor acts each round with the parameters
    the last round made (a batch is one trajectory per game of every actor, a broadcast follows each)."""
    return InsertBudget(1.0, fresh_batch(cfg, buffers), cfg.comm.n_update, n_actors, 0, buffers, group, slack=0)


def queue_slots(cfg, buffers: int, group: int, message_rows: int) -> int:
    """Slots a queue needs so its ``group`` senders never overflow it (see the module's docstring);
    ``message_rows``: the trajectories of one sender's message (an actor's games; a worker's: its actors')."""
    if cfg.impala.exchange == "sync":  # a round's batch, and one message per sender more
        return math.ceil(cfg.comm.n_update * fresh_batch(cfg, buffers) / buffers) + group * message_rows
    return group * (window(cfg, group) + message_rows)


class SenderWindow:
    """A sender's side of the asynchronous flow control: its window, grown by its queue's grants."""

    def __init__(self, cfg, comm):
        self.line = CreditLine(comm, window(cfg, comm.size - 1))

    def over(self, sent: int, version: int) -> bool:
        return self.line.over(sent)

    def close(self) -> None:
        self.line.close()


class Windows:
    """The queue's ledger of its senders' windows (no MPI): ``arrived`` per message, ``take`` as the learner takes
    the oldest trajectories; ``granted(sender)`` is the sender's total allowance."""

    def __init__(self, senders, size: int):
        self.size = size
        self.taken = dict.fromkeys(senders, 0)  # each sender's trajectories the learner has taken
        self.waiting: deque = deque()  # [sender, rows not yet taken] of each message, oldest first

    def arrived(self, sender: int, rows: int) -> None:
        if rows:
            self.waiting.append([sender, rows])

    def take(self, rows: int) -> set[int]:
        """The learner took the ``rows`` oldest trajectories: the senders whose allowance grew."""
        grew = set()
        while rows and self.waiting:
            oldest = self.waiting[0]
            k = min(rows, oldest[1])
            oldest[1] -= k
            rows -= k
            self.taken[oldest[0]] += k
            grew.add(oldest[0])
            if not oldest[1]:
                self.waiting.popleft()
        return grew

    def granted(self, sender: int) -> int:
        return self.size + self.taken[sender]
