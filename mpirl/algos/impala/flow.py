"""How IMPALA's actors are held back by their queue, and how large a queue must be so nothing is ever dropped.

Each actor sends at most ``allowed(v) = ceil(capacity / g) + v * n_update * B / A`` trajectories while it holds
parameter version ``v`` (a :class:`~mpirl.replay.ratio.InsertBudget` at one sample per insert whose warm-up is the
actor's share of its queue): ``capacity`` = ``replay.capacity``, ``g`` the actors of its queue, ``B`` =
``replay.batch_size``, ``A`` all actors. The learner publishes version ``v`` after ``(v - 1) * n_update`` batches,
each taking ``B / R`` trajectories of every one of the ``R`` queues, so a queue whose ``g = A / R`` actors are all
at version ``v`` holds at most ``g * ceil(capacity / g) + n_update * B / R`` trajectories, plus what a last step
added (one message per actor). With inference workers the senders are the workers (``A``, ``g`` count them). :func:`queue_slots` is that bound; an actor that has reached its allowance waits
(the ``throttled_s`` of the buffer's ``actors`` table) until the learner publishes again.
"""

from __future__ import annotations

import math

from mpirl.algos.impala.settings import fresh_batch
from mpirl.replay.ratio import InsertBudget


def queue_budget(cfg, n_actors: int, buffers: int, group: int) -> InsertBudget:
    """One actor's allowance: its share of its queue, and one broadcast's consumption at a time. Synchronous
    rounds (``impala.exchange = "sync"``, a batch of one trajectory per game of every actor, a broadcast after
    each) are the same budget without the queue's share: one message per version, so an actor acts each round
    with the parameters the last round made."""
    rp = cfg.replay
    warm = 0 if cfg.impala.exchange == "sync" else rp.capacity * buffers
    return InsertBudget(1.0, fresh_batch(cfg, buffers), cfg.comm.n_update, n_actors, warm, buffers, group, slack=0)


def queue_slots(cfg, buffers: int, group: int, message_rows: int) -> int:
    """Slots a queue needs so its ``group`` senders' allowances never overflow it (see the module's docstring);
    ``message_rows``: the trajectories of one sender's message (an actor's games; a worker's: its actors')."""
    rp = cfg.replay
    share = group * math.ceil(rp.capacity / max(group, 1))
    return share + math.ceil(cfg.comm.n_update * fresh_batch(cfg, buffers) / buffers) + group * message_rows
