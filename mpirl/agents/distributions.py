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

Torch functions (:func:`log_prob_entropy`) serve the learners' losses; numpy functions (:func:`sample`,
:func:`log_prob`) the actors, whose random streams are numpy generators. No MPI.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from mpirl.envs.actions import ActionSpec

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


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


# --------------------------------------------------------------------------- numpy (the actors)


@torch.no_grad()
def actor_outputs(spec: ActionSpec, out: Tensor) -> np.ndarray:
    """float64 ``[N, n_outputs]`` numpy: the head's outputs as the actors sample from them: each categorical's
    logits turned into its log-probabilities (log-softmax per dimension), a Gaussian's means as they are."""
    out = out.double()
    if spec.continuous:
        return out.cpu().numpy()
    if spec.kind == "discrete":
        return torch.log_softmax(out, dim=1).cpu().numpy()
    return torch.cat([torch.log_softmax(p, dim=1) for p in torch.split(out, list(spec.nvec), dim=1)], 1).cpu().numpy()


def sample(spec: ActionSpec, out: np.ndarray, log_std: np.ndarray | None,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Actions ``[N, *spec.shape]`` (``spec.dtype``) sampled from :func:`actor_outputs` ``out`` and their
    log-probabilities (float32 ``[N]``)."""
    n = len(out)
    if spec.continuous:
        assert log_std is not None
        a = (out + np.exp(log_std) * rng.standard_normal(out.shape)).astype(np.float32)
        return a.reshape(n, *spec.shape), log_prob(spec, out, log_std, a)
    if spec.kind == "discrete":
        actions = np.argmax(out + rng.gumbel(size=out.shape), axis=1)
        return actions, out[np.arange(n), actions].astype(np.float32)
    parts = np.split(out, np.cumsum(spec.nvec)[:-1], axis=1)
    actions = np.stack([np.argmax(p + rng.gumbel(size=p.shape), axis=1) for p in parts], axis=1)
    return actions.reshape(n, *spec.shape), log_prob(spec, out, log_std, actions)


def log_prob(spec: ActionSpec, out: np.ndarray, log_std: np.ndarray | None, actions: np.ndarray) -> np.ndarray:
    """float32 ``[N]``: the log-probabilities of ``actions`` under :func:`actor_outputs` ``out``."""
    n = len(out)
    if spec.continuous:
        assert log_std is not None
        a = np.asarray(actions, np.float32).reshape(n, -1).astype(np.float64)
        z = (a - out) * np.exp(-log_std)
        return (-0.5 * z * z - log_std - HALF_LOG_2PI).sum(-1).astype(np.float32)
    if spec.kind == "discrete":
        return out[np.arange(n), np.asarray(actions).reshape(n)].astype(np.float32)
    acts = np.asarray(actions).reshape(n, len(spec.nvec))
    parts = np.split(out, np.cumsum(spec.nvec)[:-1], axis=1)
    total = sum(p[np.arange(n), acts[:, d]] for d, p in enumerate(parts))
    return np.asarray(total, np.float64).astype(np.float32)


def uniform_entropy(spec: ActionSpec) -> float:
    """The entropy of the uniform policy over a discrete space (the sum of ``log n`` over its dimensions): the most a
    categorical policy can have. nan for Box actions (a Gaussian's entropy has no such ceiling)."""
    return math.nan if spec.continuous else float(sum(math.log(n) for n in spec.nvec))
