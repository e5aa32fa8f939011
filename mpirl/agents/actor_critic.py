"""Actor-critic networks and the IMPALA learner's train step (V-trace, :mod:`mpirl.agents.vtrace`).

The torso is the Q-networks' (:mod:`mpirl.agents.networks`: the MLP for vectors, MinAtar's convolution for small
images, Nature's for 84x84 stacks, chosen from the observation), followed by one ``hidden[-1]``-wide layer shared by
a policy head (logits over the actions) and a value head.

A trajectory record (:func:`trajectory_spec`) holds ``unroll`` steps of one game: the ``unroll + 1`` observations
(the last one bootstraps), the actions taken, the rewards, the behaviour policy's log-probability of each action,
terminated and truncated apart, the behaviour policy's value of the final observation where a step was truncated
(a time limit; what Sample Factory bootstraps with too) and the parameter version the actions were chosen with.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from mpirl.agents.tensors import to_tensors
from mpirl.agents.networks import NetworkCopy, build_network, image_floats, network_for
from mpirl.agents.vtrace import vtrace


def trajectory_spec(obs_shape: tuple[int, ...], obs_dtype, unroll: int) -> dict:
    """Field name -> (per-record shape, dtype) of one trajectory of ``unroll`` steps."""
    T = int(unroll)
    return {
        "obs": ((T + 1, *obs_shape), np.dtype(obs_dtype)),
        "action": ((T,), np.dtype(np.int64)),
        "reward": ((T,), np.dtype(np.float32)),
        "logp": ((T,), np.dtype(np.float32)),
        "terminated": ((T,), np.dtype(np.bool_)),
        "truncated": ((T,), np.dtype(np.bool_)),
        "final_value": ((T,), np.dtype(np.float32)),
        "version": ((), np.dtype(np.int64)),
    }


class ActorCritic(nn.Module):
    """Torso -> a shared ``hidden[-1]`` layer -> policy logits and a value."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, hidden: list[int], choice: str = "auto"):
        super().__init__()
        self.kind = network_for(tuple(obs_shape), choice)
        q = build_network(obs_shape, n_actions, hidden, choice)  # its torso; its dueling head is not used
        self.torso = q.torso
        features = q.head.value[0].in_features
        self.shared = nn.Sequential(nn.Linear(features, hidden[-1]), nn.ReLU())
        self.policy = nn.Linear(hidden[-1], n_actions)
        self.value = nn.Linear(hidden[-1], 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs.flatten(1) if self.kind == "mlp" else image_floats(obs)
        h = self.shared(self.torso(x.to(self.value.weight.dtype)))
        return self.policy(h), self.value(h).squeeze(-1)


class ActorCriticPolicy(NetworkCopy):
    """An actor's copy of the network: the policy's log-probabilities (actions are sampled from them) and values of
    final observations."""

    def __init__(self, obs_shape, n_actions: int, agent_cfg):
        super().__init__(ActorCritic(obs_shape, n_actions, agent_cfg.hidden, agent_cfg.network))
        self.n_actions = n_actions

    @torch.no_grad()
    def log_probs(self, obs: np.ndarray) -> np.ndarray:
        """float64 ``(k, n_actions)``: the policy's log-probabilities of every action, per observation."""
        logits, _ = self.net(torch.as_tensor(obs))
        return torch.log_softmax(logits.double(), dim=1).numpy()

    @torch.no_grad()
    def values(self, obs: np.ndarray) -> np.ndarray:
        return self.net(torch.as_tensor(obs))[1].numpy().astype(np.float32)


class Losses(NamedTuple):
    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    rho_clipped: torch.Tensor
    advantage: torch.Tensor  # mean |A| of the batch


def impala_losses(net: nn.Module, b: dict[str, torch.Tensor], gamma: float, rho_bar: float, c_bar: float, lam: float,
                  value_coef: float, entropy_coef: float) -> Losses:
    """The IMPALA loss of a batch of trajectories (tensors ``[B, ...]`` as :func:`trajectory_spec`): the policy
    gradient with V-trace advantages, ``value_coef`` x half the squared error to the V-trace targets, minus
    ``entropy_coef`` x the policy's entropy; means over the batch's steps."""
    obs = b["obs"]
    B, T1 = obs.shape[:2]
    logits, values = net(obs.reshape(B * T1, *obs.shape[2:]))
    logits, values = logits.view(B, T1, -1)[:, :-1], values.view(B, T1)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(2, b["action"].unsqueeze(-1)).squeeze(-1)
    targets = vtrace(b["logp"], logp.detach(), b["reward"], values[:, :-1].detach(), values[:, -1].detach(),
                     b["terminated"], b["truncated"], b["final_value"], gamma, rho_bar, c_bar, lam)
    policy = -(targets.advantages * logp).mean()
    value = 0.5 * (targets.vs - values[:, :-1]).pow(2).mean()
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    total = policy + value_coef * value - entropy_coef * entropy
    return Losses(total, policy, value, entropy, targets.rho_clipped, targets.advantages.abs().mean())


class ImpalaLearner:
    """The learner's network, optimizer (Adam or RMSProp) and one train step on a batch of trajectories."""

    def __init__(self, obs_shape, n_actions: int, agent_cfg, impala_cfg, device: torch.device, seed: int = 0):
        torch.manual_seed(seed)
        self.device = device
        self.net = ActorCritic(obs_shape, n_actions, agent_cfg.hidden, agent_cfg.network).to(device)
        c = self.cfg = impala_cfg
        self.gamma, self.grad_clip = agent_cfg.gamma, agent_cfg.grad_clip
        if c.optimizer == "rmsprop":  # IMPALA's: RMSProp with a large epsilon
            self.optimizer: torch.optim.Optimizer = torch.optim.RMSprop(
                self.net.parameters(), lr=agent_cfg.lr, alpha=c.rmsprop_alpha, eps=c.rmsprop_eps)
        else:
            self.optimizer = torch.optim.Adam(self.net.parameters(), lr=agent_cfg.lr, eps=agent_cfg.adam_eps)
        self.steps = 0
        self.n_params = sum(p.numel() for p in self.net.parameters())
        self.fault = ""  # what was not finite in the last skipped batch

    def losses(self, b: dict[str, torch.Tensor]) -> Losses:
        c = self.cfg
        return impala_losses(self.net, b, self.gamma, c.rho_bar, c.c_bar, c.lam, c.value_coef, c.entropy_coef)

    def train_step(self, batch: dict[str, np.ndarray]) -> dict[str, float] | None:
        """One gradient step; the step's statistics, or None (no step) when the loss or gradient is not finite."""
        b = to_tensors(batch, self.device)
        out = self.losses(b)
        self.optimizer.zero_grad(set_to_none=True)
        out.total.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.grad_clip)
        if not (torch.isfinite(out.total) and torch.isfinite(norm)):
            self.fault = (f"the loss was {float(out.total.detach()):g} and the gradient's norm {float(norm):g} "
                          f"(rewards up to {float(b['reward'].abs().max()):g})")
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.optimizer.step()
        self.steps += 1
        return {"loss": float(out.total.detach()), "policy_loss": float(out.policy.detach()),
                "value_loss": float(out.value.detach()), "entropy": float(out.entropy.detach()),
                "rho_clipped": float(out.rho_clipped), "advantage": float(out.advantage.detach()),
                "grad_norm": float(norm)}

    def flat_params(self) -> np.ndarray:
        return torch.nn.utils.parameters_to_vector(self.net.parameters()).detach().cpu().numpy()

    def state(self) -> dict:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "agent_steps": self.steps}

    def restore(self, st: dict) -> None:
        self.net.load_state_dict(st["net"])
        self.optimizer.load_state_dict(st["optimizer"])
        self.steps = int(st["agent_steps"])
