"""V-trace (Espeholt et al. 2018, IMPALA §4.1): off-policy value targets and policy-gradient advantages for
trajectories acted by an older policy.

For one trajectory of T steps acted by the behaviour policy mu and learned by the target policy pi, with
importance ratios r_t = pi(a_t|x_t) / mu(a_t|x_t), rho_t = min(rho_bar, r_t) and c_t = lambda min(c_bar, r_t)::

    delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))
    v_s     = V(x_s) + delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1}))        (the recursion of the paper's Remark 1)
    A_s     = rho_s (r_s + gamma_s v_{s+1} - V(x_s))                        (the policy gradient's advantage)

Episode ends inside a trajectory are kept apart: after a *terminated* step nothing is bootstrapped
(gamma_t = 0); after a *truncated* step (a time limit) the value of the episode's final observation is, and the
recursion stops there (the next step belongs to the next episode). At the trajectory's end V(x_T) bootstraps.
On-policy (r_t = 1) with rho_bar, c_bar >= 1 and lambda = 1, v_s is the n-step return to the trajectory's end.

Tensors are ``[B, T]`` (batch of trajectories, time); no gradient flows through the targets.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class VTrace(NamedTuple):
    vs: torch.Tensor  # [B, T] the value targets
    advantages: torch.Tensor  # [B, T] the policy gradient's advantages, rho_s (r_s + gamma_s v_{s+1} - V(x_s))
    rho_clipped: torch.Tensor  # [] the fraction of steps whose ratio rho_bar clipped (by more than float rounding)


@torch.no_grad()
def vtrace(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor,
           bootstrap: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, final_values: torch.Tensor,
           gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0, lam: float = 1.0) -> VTrace:
    """V-trace targets of a batch of trajectories.

    ``behaviour_logp``, ``target_logp``: log mu(a_t|x_t), log pi(a_t|x_t); ``values``: V(x_t) for t < T;
    ``bootstrap``: [B] V(x_T); ``terminated``, ``truncated``: [B, T] bool, the episode ended after step t;
    ``final_values``: [B, T] the value of the final observation where a step was truncated (read there only).
    """
    ratio = torch.exp(target_logp - behaviour_logp)
    rho = torch.clamp(ratio, max=rho_bar)
    c = lam * torch.clamp(ratio, max=c_bar)
    term, trunc = terminated.to(values.dtype), (truncated & ~terminated).to(values.dtype)
    # V(x_{t+1}) as step t sees it: the next step's value, the bootstrap at the end, the final observation's value
    # after a truncation, nothing after a termination (gamma_t = 0 below).
    next_values = torch.cat([values[:, 1:], bootstrap[:, None]], dim=1)
    next_values = torch.lerp(next_values, final_values, trunc)
    discounts = gamma * (1.0 - term)
    deltas = rho * (rewards + discounts * next_values - values)
    chain = discounts * c * (1.0 - trunc)  # no trace across an episode's end
    acc = torch.zeros_like(bootstrap)
    corrections = torch.empty_like(values)
    for t in range(values.shape[1] - 1, -1, -1):
        acc = deltas[:, t] + chain[:, t] * acc
        corrections[:, t] = acc
    vs = values + corrections
    # v_{s+1} as step s sees it, with the same ends as V(x_{s+1}).
    next_vs = torch.lerp(torch.cat([vs[:, 1:], bootstrap[:, None]], dim=1), final_values, trunc)
    advantages = rho * (rewards + discounts * next_vs - values)
    # The actor's and the learner's forward passes round differently: a ratio within 1e-4 of rho_bar is not counted.
    return VTrace(vs, advantages, (ratio > rho_bar * (1 + 1e-4)).to(values.dtype).mean())
