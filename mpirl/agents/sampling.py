"""The actors' side of the sampling policies' action distributions (:mod:`mpirl.agents.distributions` holds the
learners', in torch): the head's outputs as the actors sample from them, the samples and their log-probabilities,
in numpy alone (an actor on vector observations never imports torch: :mod:`mpirl.agents.actor_critic_acting`).

* **categorical** (Discrete, MultiDiscrete): each dimension's logits become its log-probabilities (a log-softmax
  in float64); actors sample by the Gumbel-max trick.
* **diagonal Gaussian** (Box): the means as they are, the log standard deviation the network's; the sample is
  rounded to the float32 it is stored as before its log-probability is taken, so the learner's recomputation from
  the stored action reproduces it.

No MPI, no torch.
"""

from __future__ import annotations

import math

import numpy as np

from mpirl.envs.actions import ActionSpec

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def policy_outputs(spec: ActionSpec, out: np.ndarray) -> np.ndarray:
    """float64 ``[N, n_outputs]``: the head's outputs ``out`` as the actors sample from them: each categorical's
    logits turned into its log-probabilities (log-softmax per dimension), a Gaussian's means as they are."""
    out = np.asarray(out, np.float64)
    if spec.continuous:
        return out
    if spec.kind == "discrete":
        return _log_softmax(out)
    return np.concatenate([_log_softmax(p) for p in np.split(out, np.cumsum(spec.nvec)[:-1], axis=1)], axis=1)


def sample(spec: ActionSpec, out: np.ndarray, log_std: np.ndarray | None,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Actions ``[N, *spec.shape]`` (``spec.dtype``) sampled from :func:`policy_outputs` ``out`` and their
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
    """float32 ``[N]``: the log-probabilities of ``actions`` under :func:`policy_outputs` ``out``."""
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
