"""The pure parts of on-policy actor-critic learning with gradients computed where the rollouts are (A2C / A3C,
Mnih et al. 2016; PPO, Schulman et al. 2017): advantages, losses and minibatches.

**Advantages** (generalized advantage estimation, Schulman et al. 2016). A rollout is T steps of E games stepped
together, tensors time-major ``[T, E]``. With V'(x_{t+1}) the value step t bootstraps from::

    delta_t = r_t + gamma (1 - term_t) V'(x_{t+1}) - V(x_t)
    A_t     = delta_t + gamma lambda (1 - end_t) A_{t+1}            (A_T = 0)
    R_t     = A_t + V(x_t)                                           (the value target)

V'(x_{t+1}) is the next step's value, V(x_T) (the bootstrap) at the rollout's end, and the value of the episode's
final observation after a *truncated* step (a time limit); after a *terminated* step nothing is bootstrapped. The
sum never chains across an episode's end (end_t = term_t or trunc_t): the next step belongs to the next episode.
These are :mod:`mpirl.agents.vtrace`'s ends. With lambda = 1, R_t is the n-step return to the rollout's end (or
the episode's) and A_t = R_t - V(x_t): A2C's advantage; lambda < 1 trades its variance for the value's bias.

**Losses**, means over a flat batch of N steps (a caller flattens ``[T, E]``), with the advantages held fixed:

* A2C: ``-A log pi(a|x)`` + value_coef x ``(R - V(x))^2 / 2`` - entropy_coef x ``H(pi(.|x))``.
* PPO's clipped surrogate: with the ratio rho = pi(a|x) / pi_old(a|x) and A normalised per minibatch,
  ``-min(rho A, clip(rho, 1 - eps, 1 + eps) A)``, the same value and entropy terms (no value clipping). Where the
  clipped branch is the smaller, the sample gives the policy no gradient. Reported too: the fraction of samples with
  ``|rho - 1| > eps`` and the estimate ``E[(rho - 1) - log rho]`` of KL(pi_old || pi) (Schulman's "k3": unbiased,
  never negative).

A worker's gradient crosses the network as one flat vector: :mod:`mpirl.agents.flat_grads`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn


@torch.no_grad()
def gae(rewards: Tensor, values: Tensor, bootstrap: Tensor, terminated: Tensor, truncated: Tensor,
        final_values: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """``(advantages, returns)``, both ``[T, E]`` in the dtype of ``values``, returns = advantages + values.

    ``rewards``, ``values``: [T, E] r_t and V(x_t); ``bootstrap``: [E] V(x_T); ``terminated``, ``truncated``:
    [T, E] bool, the episode ended after step t; ``final_values``: [T, E] the value of the final observation where a
    step was truncated and not terminated (read there only: elsewhere it may hold anything, NaN included).
    """
    if values.dim() != 2 or bootstrap.shape != values.shape[1:]:
        raise ValueError(f"values must be [T, E] and bootstrap [E]; got {tuple(values.shape)} and "
                         f"{tuple(bootstrap.shape)}")
    for name, x in (("rewards", rewards), ("terminated", terminated), ("truncated", truncated),
                    ("final_values", final_values)):
        if x.shape != values.shape:
            raise ValueError(f"{name} must be [T, E] like values {tuple(values.shape)}; got {tuple(x.shape)}")
    dtype = values.dtype
    term = terminated.bool()
    trunc = truncated.bool() & ~term
    # V'(x_{t+1}) as step t sees it: the next step's value, the bootstrap at the end, the final observation's value
    # after a truncation, zero after a termination.
    next_values = torch.cat([values[1:], bootstrap.to(dtype)[None]], dim=0)
    next_values = torch.where(trunc, final_values.to(dtype), next_values)
    next_values = torch.where(term, torch.zeros_like(next_values), next_values)
    deltas = rewards.to(dtype) + gamma * next_values - values
    chain = (gamma * lam) * (~(term | trunc)).to(dtype)  # no sum across an episode's end
    advantages = torch.empty_like(values)
    acc = torch.zeros_like(values[0])
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + chain[t] * acc
        advantages[t] = acc
    return advantages, advantages + values


class PGLosses(NamedTuple):
    total: Tensor  # policy + value_coef * value - entropy_coef * entropy (the one to differentiate)
    policy: Tensor
    value: Tensor  # half the mean squared error to the returns
    entropy: Tensor  # the policy's mean entropy
    clip_fraction: Tensor  # detached: the fraction of samples whose ratio is outside [1 - clip, 1 + clip]; 0 for A2C
    approx_kl: Tensor  # detached: mean (rho - 1) - log rho, an estimate of KL(pi_old || pi); 0 for A2C


def _evaluate(net: nn.Module, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(log pi(a|x) [N], entropy of pi(.|x) [N], V(x) [N])`` of a flat batch (the network's action
    distribution: :meth:`mpirl.agents.actor_critic.ActorCritic.log_prob_entropy`)."""
    out, values = net(obs)
    logp, entropy = net.log_prob_entropy(out, actions)
    return logp, entropy, values


def a2c_losses(net: nn.Module, obs: Tensor, actions: Tensor, advantages: Tensor, returns: Tensor, value_coef: float,
               entropy_coef: float, evaluated: tuple[Tensor, Tensor, Tensor] | None = None) -> PGLosses:
    """A2C's losses of a flat batch: ``obs`` [N, ...], ``actions`` [N, *action shape], ``advantages`` and ``returns``
    [N] (from :func:`gae`; no gradient flows through them); means over the batch. ``evaluated``: the network's
    ``(log pi(a|x), entropy, V(x))`` of the batch when the caller computed them (a recurrent network's unroll)."""
    logp, entropy, values = evaluated if evaluated is not None else _evaluate(net, obs, actions)
    adv = advantages.detach().to(logp.dtype)
    policy = -(adv * logp).mean()
    value = 0.5 * (returns.detach().to(values.dtype) - values).pow(2).mean()
    ent = entropy.mean()
    total = policy + value_coef * value - entropy_coef * ent
    zero = torch.zeros((), dtype=total.dtype, device=total.device)
    return PGLosses(total, policy, value, ent, zero, zero.clone())


def ppo_losses(net: nn.Module, obs: Tensor, actions: Tensor, old_logp: Tensor, advantages: Tensor, returns: Tensor,
               clip: float, value_coef: float, entropy_coef: float, normalize: bool = True,
               evaluated: tuple[Tensor, Tensor, Tensor] | None = None) -> PGLosses:
    """PPO's clipped-surrogate losses of a flat minibatch: as :func:`a2c_losses`, with ``old_logp`` [N] the log
    pi_old(a|x) the rollout was acted with and ``clip`` the ratio's range 1 +- clip. With ``normalize`` the
    advantages are normalised over the minibatch, ``(A - mean) / (std + 1e-8)`` (the sample std; a minibatch of
    one is left as it is). ``evaluated``: as :func:`a2c_losses`."""
    logp, entropy, values = evaluated if evaluated is not None else _evaluate(net, obs, actions)
    adv = advantages.detach().to(logp.dtype)
    if normalize and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    log_ratio = logp - old_logp.detach().to(logp.dtype)
    ratio = torch.exp(log_ratio)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * adv)
    policy = -surrogate.mean()
    value = 0.5 * (returns.detach().to(values.dtype) - values).pow(2).mean()
    ent = entropy.mean()
    total = policy + value_coef * value - entropy_coef * ent
    with torch.no_grad():
        clip_fraction = ((ratio - 1.0).abs() > clip).to(ratio.dtype).mean()
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
    return PGLosses(total, policy, value, ent, clip_fraction, approx_kl)


def minibatch_indices(n: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation of ``range(n)`` cut into ``k`` parts of nearly equal size (the first ``n % k`` one
    longer): every index in exactly one minibatch."""
    if k < 1 or k > n:
        raise ValueError(f"cannot cut {n} samples into {k} minibatches (need 1 <= k <= n)")
    return np.array_split(rng.permutation(n), k)
