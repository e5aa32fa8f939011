"""The action distributions of the sampling policies (IMPALA, the gradient family), one per kind of action space
(:class:`~mpirl.envs.actions.ActionSpec`):

* **categorical** (Discrete, MultiDiscrete): the policy head's outputs are logits, ``sum(nvec)`` of them, one
  categorical per dimension; a multi-dimensional action's log-probability is the sum of its dimensions', its
  entropy too. Actors sample by the Gumbel-max trick on float64 log-probabilities.
* **diagonal Gaussian** (Box): the head's outputs are the means, one per action number; the log standard deviation
  is a parameter of the network, the same in every state (as SB3's and CleanRL's PPO for MuJoCo: one learned
  exploration noise per dimension, which cannot collapse in one state while staying wide in another and keeps the
  policy's entropy a readable number). The sample is *not* squashed: the environment gets it clipped to the
  space's bounds (:meth:`~mpirl.envs.actions.ActionSpec.to_env`) and the recorded action, whose log-probability
  the learner recomputes, is the unclipped sample (CleanRL's and SB3's convention). Actors round the sample to the
  float32 it is stored as *before* taking its log-probability, so the learner's recomputation from the stored
  action reproduces it.

Torch functions (:func:`log_prob_entropy`) serve the learners' losses; the actors' side, whose random streams are
numpy generators, is numpy alone and lives in :mod:`mpirl.agents.sampling` (:func:`~mpirl.agents.sampling.sample`,
:func:`~mpirl.agents.sampling.log_prob`), so that an actor need not import torch. No MPI.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mpirl.agents.sampling import HALF_LOG_2PI, policy_outputs
from mpirl.envs.actions import ActionSpec


# --------------------------------------------------------------------------- torch (the learners)


def gaussian_log_prob(mean: Tensor, log_std: Tensor, actions: Tensor) -> Tensor:
    """``[N]``: the log-density of ``actions`` ``[N, D]`` under independent normals of ``mean`` ``[N, D]`` and
    ``log_std`` ``[D]`` (or ``[N, D]``), summed over the D dimensions."""
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.pow(2) - log_std - HALF_LOG_2PI).sum(-1)


def gaussian_entropy(log_std: Tensor, n: int) -> Tensor:
    """``[n]``: the entropy of the diagonal Gaussian of ``log_std`` ``[D]``, ``sum(log_std + (1 + log 2 pi) / 2)``."""
    return (log_std + 0.5 + HALF_LOG_2PI).sum(-1).expand(n)


def categorical_log_prob_entropy(logits: Tensor, nvec: tuple, actions: Tensor) -> tuple[Tensor, Tensor]:
    """``([N], [N])``: log-probability of ``actions`` ``[N, len(nvec)]`` (or ``[N]`` for one dimension) and the
    entropy, each summed over the dimensions whose logits ``logits`` ``[N, sum(nvec)]`` holds side by side."""
    actions = actions.long().reshape(len(logits), len(nvec))
    logp = entropy = None
    for d, part in enumerate(torch.split(logits, list(nvec), dim=-1)):
        lp_all = torch.log_softmax(part, dim=-1)
        lp = lp_all.gather(1, actions[:, d:d + 1]).squeeze(1)
        ent = -(lp_all.exp() * lp_all).sum(-1)
        logp, entropy = (lp, ent) if logp is None else (logp + lp, entropy + ent)
    assert logp is not None and entropy is not None
    return logp, entropy


def log_prob_entropy(spec: ActionSpec, out: Tensor, log_std: Tensor | None, actions: Tensor) -> tuple[Tensor, Tensor]:
    """``(log pi(a|x) [N], entropy of pi(.|x) [N])`` of the policy head's outputs ``out`` ``[N, n_outputs]``,
    the actions ``[N, *spec.shape]`` and (Box) the log standard deviation ``[D]``."""
    n = len(out)
    if spec.continuous:
        assert log_std is not None, "a Gaussian policy needs its log standard deviation"
        a = actions.reshape(n, -1).to(out.dtype)
        return gaussian_log_prob(out, log_std.to(out.dtype), a), gaussian_entropy(log_std.to(out.dtype), n)
    return categorical_log_prob_entropy(out, spec.nvec, actions)


@torch.no_grad()
def actor_outputs(spec: ActionSpec, out: Tensor) -> np.ndarray:
    """:func:`~mpirl.agents.sampling.policy_outputs` of a torch network's head outputs ``out``."""
    return policy_outputs(spec, out.double().cpu().numpy())
