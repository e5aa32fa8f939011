"""What the learner loop (:mod:`mpirl.actor_learner.learner`) agrees with the learners it trains with: nothing when
it is alone (:class:`Alone`), and with K data-parallel learners (``topology.learners``; Gorila's several learners)
the agreement of :mod:`mpirl.actor_learner.learner_peers` (:class:`DataParallel`).

The loop asks its :class:`PeerAgreement` at fixed points of every turn, on every learner in the same order:

* :meth:`~PeerAgreement.before_step`, with this learner's part of the next batch (None: the first learner's stop
  rule fired): K learners gather the control values (the first learner's stop and checkpoint, the parts'
  statistics, a parameter CRC now and then), so each learner stops, checkpoints and trains on the same turn;
* :meth:`~PeerAgreement.checkpoint_after_step`: whether to checkpoint right after the step (one learner: when its
  cadence says; K learners: never, their checkpoint comes with the next agreement);
* at a checkpoint :meth:`~PeerAgreement.checkpoint_extra` (K learners: every learner's per-shard sample counts,
  gathered to the first, which alone writes the checkpoint), on ``--resume`` :meth:`~PeerAgreement.restored`
  (learner k takes back its own counts), at the end :meth:`~PeerAgreement.final_attrs` (the parameters' CRC).

The first learner (or the one) publishes every ``comm.n_update`` steps, writes ``learner.h5`` and the checkpoints;
learner k writes ``learner_<rank>.h5``.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Protocol

import numpy as np

from mpirl.actor_learner.batch_sources import Batch
from mpirl.actor_learner.counters import Counters
from mpirl.actor_learner.learner_algorithm import LearnerAlgorithm
from mpirl.actor_learner.learner_peers import CHECK_EVERY, LearnerPeers

FOLLOWER_STOPPED = "the first learner stopped the job"  # the stop reason of every learner but the first


class Turn(NamedTuple):
    """What the learners agreed before a train step."""

    stop: bool  # stop now, without the step
    checkpoint: bool  # checkpoint before the step
    stats: np.ndarray | None  # each learner's shared statistic of its part, in learner order (None: alone)
    reason: str = ""  # the stop reason of a learner that follows another's stop ('': its own rule's)


class PeerAgreement(Protocol):
    """What the loop asks of the learners it trains with (see the module)."""

    @property
    def peers(self) -> LearnerPeers | None:
        """The learners the algorithm's train step shares each batch with (None: alone)."""

    @property
    def lead(self) -> bool:
        """Alone, or the first learner: it decides the stop, publishes, writes ``learner.h5`` and the checkpoints."""

    def file_attrs(self) -> dict:
        """Attributes of this learner's metrics file."""

    def before_step(self, batch: Batch | None, algo: LearnerAlgorithm, checkpoint_due: Callable[[], bool],
                    poll: Callable[[], None]) -> Turn:
        """The turn's agreement: ``batch`` is this learner's part (None: the first learner is to stop);
        ``checkpoint_due``: the first learner's cadence; ``poll``: what to keep going while waiting for the others."""

    def checkpoint_after_step(self, checkpoint_due: Callable[[], bool]) -> bool:
        """Whether to checkpoint right after a train step."""

    def restored(self, st: dict, counters: Counters) -> None:
        """After the loop restored ``counters`` from the checkpoint ``st``: this learner's own part of them."""

    def checkpoint_extra(self, counters: Counters) -> dict:
        """What the checkpoint keeps beside the loop's state (collective with K learners: on every learner)."""

    def final_attrs(self, params: Callable[[], np.ndarray]) -> dict:
        """More attributes of the metrics file at the end (``params``: the flat parameters, when needed)."""


class Alone:
    """One learner: nothing to agree. It stops when its rule says and checkpoints right after the step that made
    one due."""

    peers: LearnerPeers | None = None
    lead = True

    def file_attrs(self) -> dict:
        return {}

    def before_step(self, batch: Batch | None, algo: LearnerAlgorithm, checkpoint_due: Callable[[], bool],
                    poll: Callable[[], None]) -> Turn:
        return Turn(batch is None, False, None)

    def checkpoint_after_step(self, checkpoint_due: Callable[[], bool]) -> bool:
        return checkpoint_due()

    def restored(self, st: dict, counters: Counters) -> None:
        """The counters are this learner's as saved."""

    def checkpoint_extra(self, counters: Counters) -> dict:
        return {}

    def final_attrs(self, params: Callable[[], np.ndarray]) -> dict:
        return {}


class DataParallel:
    """K data-parallel learners, this one's side: each turn the control gather of :class:`LearnerPeers`, then the
    train step whose gradients the algorithm sums over them (it is made with :attr:`peers`)."""

    def __init__(self, peers: LearnerPeers):
        self.peers = peers

    @property
    def lead(self) -> bool:
        return self.peers.lead

    def file_attrs(self) -> dict:
        return {"learner": self.peers.index, "learners": self.peers.K}

    def before_step(self, batch: Batch | None, algo: LearnerAlgorithm, checkpoint_due: Callable[[], bool],
                    poll: Callable[[], None]) -> Turn:
        """The control gather: the first learner's stop (``batch`` None) and checkpoint, each part's shared
        statistic, every :data:`CHECK_EVERY` steps the parameters' CRC."""
        stop, steps = batch is None, algo.steps
        ctl = self.peers.control(stop, self.lead and not stop and checkpoint_due(),
                                 algo.shared_stat(batch) if batch is not None else math.inf,
                                 algo.flat_params() if steps % CHECK_EVERY == 0 else None, steps, poll=poll)
        return Turn(ctl.stop, ctl.checkpoint, ctl.stats, "" if self.lead else FOLLOWER_STOPPED)

    def checkpoint_after_step(self, checkpoint_due: Callable[[], bool]) -> bool:
        """Never: the first learner's cadence is agreed before the next step, so every learner saves together."""
        return False

    def restored(self, st: dict, counters: Counters) -> None:
        """Its own samples per shard; episodes and returns are the first learner's."""
        counters.consumed = list(st["learners_consumed"][self.peers.index])
        if not self.lead:
            counters.episodes = 0
            counters.returns.clear()

    def checkpoint_extra(self, counters: Counters) -> dict:
        """Every learner's samples per shard, gathered to the first, which keeps them with the state they share."""
        return {"learners_consumed": self.peers.gather_counts(counters.consumed)}

    def final_attrs(self, params: Callable[[], np.ndarray]) -> dict:
        return {"params_crc32": int(self.peers.crc(params()))}
