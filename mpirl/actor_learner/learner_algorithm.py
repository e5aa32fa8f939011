"""What an algorithm gives the learner loop (:mod:`mpirl.actor_learner.learner`): its agent (networks and optimizer on a
device), its train step, its metric columns and tables, its checkpoint state, where its batches come from, and
what several data-parallel learners share (:mod:`mpirl.actor_learner.data_parallel`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Protocol

import numpy as np
import torch

from mpirl.metrics.writer import MetricsFile
from mpirl.actor_learner.batch_sources import Batch, BatchSource, LocalReplay, SourceInputs
from mpirl.job.context import RoleContext
from mpirl.actor_learner.learner_peers import LearnerPeers
from mpirl.actor_learner.counters import Counters


class Agent(Protocol):
    """The learning agent an algorithm trains (:mod:`mpirl.agents`): networks and optimizer on a device."""

    @property
    def steps(self) -> int:
        """Train steps done (a skipped batch is none)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def n_params(self) -> int:
        """The length of the flat parameter vector every broadcast carries."""

    def flat_params(self) -> np.ndarray: ...


class LearnerAlgorithm(ABC):
    """What an algorithm gives the learner loop: its agent (networks and optimizer), its train step, its metric
    columns and tables, its checkpoint state. Made by the loop as ``cls(ctx, rng, counters, peers)`` once the loop
    has set the rank's torch threads; the constructor sets ``agent``.

    ``peers``: with K data-parallel learners (``topology.learners``) the learners this one shares each batch with
    (its train step sums the gradients over them); None alone."""

    agent: Agent

    def __init__(self, ctx: RoleContext, rng: np.random.Generator, counters: Counters,
                 peers: LearnerPeers | None = None):
        self.ctx, self.cfg, self.rng, self.counters = ctx, ctx.cfg, rng, counters
        self.peers = peers

    # -- the agent -------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Train steps done (a skipped batch is none); a checkpoint's ``train_steps``."""
        return self.agent.steps

    @property
    def device(self) -> torch.device:
        return self.agent.device

    @property
    def n_params(self) -> int:
        return self.agent.n_params

    def flat_params(self) -> np.ndarray:
        """The parameters to publish, flat."""
        return self.agent.flat_params()

    @abstractmethod
    def train(self, batch: Batch, peer_stats: np.ndarray | None = None) -> np.ndarray | None:
        """One train step (the caller accounts its time as compute); the samples' new values, or None when the
        step was skipped for a non-finite loss or gradient. ``peer_stats``: with K learners, each learner's
        :meth:`shared_stat` of its part of the batch, in learner order."""

    @abstractmethod
    def divergence(self, in_a_row: int) -> str:
        """The message that ends the job after ``in_a_row`` skipped batches in a row."""

    def transferred(self, mean_value: float) -> None:
        """The mean value (priority, weight) of the experiences a transfer from the buffers just brought."""

    # -- K data-parallel learners (topology.learners) -----------------------------------
    @property
    def lead(self) -> bool:
        """Alone, or the first of the learners (the one that tests, publishes and decides)."""
        return self.peers is None or self.peers.lead

    def shared_stat(self, batch: Batch) -> float:
        """A statistic of this learner's part that the train step needs over the whole batch (gathered, it comes
        to :meth:`train` as ``peer_stats``): Ape-X's smallest sampling probability."""
        return 0.0

    # -- checkpoints ---------------------------------------------------------------
    @abstractmethod
    def state(self) -> dict:
        """Networks, optimizer and the algorithm's own counters for a checkpoint (keys apart from the loop's)."""

    @abstractmethod
    def restore(self, st: dict) -> None: ...

    # -- metrics -------------------------------------------------------------------
    @abstractmethod
    def file_attrs(self, threads: int) -> dict:
        """The attributes of ``learner.h5``."""

    @abstractmethod
    def columns(self) -> tuple[dict, dict]:
        """The ``train`` table's columns of the algorithm: its statistics (after ``env_steps``) and its timers
        (after ``comm_s``)."""

    def open_tables(self, file: MetricsFile) -> None:
        """Tables of the algorithm's own beyond ``train`` (on resume: truncated to the checkpoint)."""

    @abstractmethod
    def row(self) -> dict:
        """The values of :meth:`columns` for a ``train`` row (means since the last row), then start over."""

    # -- where batches come from, and the end ------------------------------------------
    def batch_source(self, given: SourceInputs) -> BatchSource | None:
        """A source of the algorithm's own (a trajectory queue), made from what the loop hands a source; None: the
        replay placement's (remote shards or a local memory, by ``replay.architecture``)."""
        return None

    def local_memory(self, capacity: int, rows: int) -> LocalReplay:
        """The replay the learner keeps itself when the buffers dump to it, drawing ``rows`` samples a batch (the
        batch, or with K data-parallel learners this learner's part: each keeps a copy of the dumps)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no local replay")

    def finish(self) -> None:
        """Before the last checkpoint (e.g. the final policy's test episodes)."""


# What the loop makes its algorithm with: ``cls(ctx, rng, counters, peers)``.
AlgorithmFactory = Callable[[RoleContext, np.random.Generator, Counters, LearnerPeers | None], LearnerAlgorithm]
