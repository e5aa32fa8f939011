"""What a train step shares with the learners it trains with, and what it reports when it cannot take a step: the
learners' gradient sum (:class:`GradientPeers`) and the first thing on the way from the batch to the update that was
not finite (:class:`Fault`). The replay algorithms' agents (DQN, QMIX) use both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


@dataclass
class Fault:
    """Why a train step was skipped: the first thing on the way from the batch to the update that was not finite.

    ``kind``: ``"batch"`` (rewards, discounts or observations), ``"weights"`` (importance weights),
    ``"parameters"`` (the online network's), ``"q"`` (its Q-values), ``"targets"`` (the n-step targets),
    ``"loss"`` (its inputs finite, the loss not), ``"gradient"`` or, with several learners, ``"peer"`` (another
    learner's part of the batch, this one's finite); ``detail``: what and where, in words.
    """
    kind: str
    detail: str


def not_finite(t: torch.Tensor) -> int:
    return int((~torch.isfinite(t)).sum())


class GradientPeers(Protocol):
    """The learners a train step shares its batch with (:class:`mpirl.actor_learner.learner_peers.LearnerPeers`)."""

    total: int  # rows of the whole batch

    def sum_grads(self, params, *losses: torch.Tensor) -> list[torch.Tensor]:
        """Replace each parameter's ``.grad`` with the sum over the learners; the summed losses."""

    def sum_values(self, values) -> np.ndarray:
        """A few values summed over the learners (the counts a loss divides by)."""

    def others_part(self) -> str:
        """After a sum that was not finite: '' if this learner's part was not finite either, else whose was."""
