"""A trained policy's deterministic actions as one torch module: what ``mpirl play`` plays by default and what
``mpirl export`` traces into TorchScript. No MPI, no environment.

Each module takes a batch of observations as the job's games give them (``obs_shape``; images channels first, the
pixels' own dtype) with everything the policy needs before its network inside: the job's observation normalisation
(its running mean and variance frozen at the checkpoint, then the clip) and the images' scaling (the networks' own).
It returns actions as the environment takes them:

* :class:`GreedyActions` — a Q-network's best action (Ape-X; DistQL's table through :class:`TableActions`);
* :class:`ModeActions` — an actor-critic's most likely action: each categorical's argmax (plus the space's
  ``start``), or a Gaussian's mean clipped to the action space's bounds; a recurrent policy's
  :class:`RecurrentModeActions` also takes and returns the LSTM core's state and where episodes start.

Only tensor operations whose shapes follow the input: ``torch.jit.trace`` records them for any batch size.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mpirl.agents.running_stats import EPS, Normalization
from mpirl.envs.actions import ActionSpec


class GreedyActions(nn.Module):
    """argmax_a Q(obs, a) of a Q-network, int64 ``[N]``."""

    def __init__(self, q_net: nn.Module):
        super().__init__()
        self.q = q_net

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs).argmax(dim=1)


class TableActions(nn.Module):
    """A Q-table's best action of each state index ``[N]`` (int64): the first of the best (numpy's argmax)."""

    def __init__(self, q: np.ndarray):
        super().__init__()
        self.register_buffer("q", torch.as_tensor(np.asarray(q, np.float64)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q[obs.reshape(-1).long()].argmax(dim=1)


class Normalize(nn.Module):
    """The job's observation normalisation as it stood at the checkpoint: ``clip((x - mean) / sqrt(var + eps))`` in
    float64, as :meth:`~mpirl.agents.running_stats.Normalization.normalize` computes it; the identity when off."""

    def __init__(self, norm: Normalization | None):
        super().__init__()
        stats = None if norm is None else norm.obs
        self.on = stats is not None
        mean, var, s, self.clip = np.zeros(1), np.ones(1), 1.0, 0.0
        if norm is not None and stats is not None:
            mean, var = (np.asarray(v, np.float64).reshape(-1) for v in (stats.mean, stats.var))
            # Images: the statistics are of pixels x 1/255 (s); (s x - m) / sd = (x - m / s) / (sd / s), raw pixels.
            s, self.clip = norm.obs_scale, float(norm.obs_clip)
        self.register_buffer("mean", torch.as_tensor(mean / s))
        self.register_buffer("scale", torch.as_tensor(np.sqrt(var + EPS) / s))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.on:
            return obs
        x = (obs.reshape(obs.shape[0], -1).double() - self.mean) / self.scale
        return x.clamp(-self.clip, self.clip).float().reshape(obs.shape)


class _Actions(nn.Module):
    """The head's outputs as the environment's actions (see :class:`ModeActions`)."""

    def __init__(self, spec: ActionSpec):
        super().__init__()
        self.kind, self.nvec = spec.kind, [int(n) for n in spec.nvec]
        self.shape = [int(s) for s in spec.shape]
        start = np.asarray(spec.start if spec.start else np.zeros(max(1, len(self.nvec))), np.int64)
        self.register_buffer("start", torch.as_tensor(start))
        low = spec.low if spec.low is not None else np.full(max(1, spec.size), -np.inf)
        high = spec.high if spec.high is not None else np.full(max(1, spec.size), np.inf)
        self.register_buffer("low", torch.as_tensor(np.asarray(low, np.float32).reshape(-1)))
        self.register_buffer("high", torch.as_tensor(np.asarray(high, np.float32).reshape(-1)))

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        n = out.shape[0]
        if self.kind == "box":
            a = torch.maximum(torch.minimum(out.float(), self.high), self.low)
            return a.reshape([n] + self.shape)
        if self.kind == "discrete":
            return out.argmax(dim=1) + self.start[0]
        parts = torch.split(out, self.nvec, dim=1)
        a = torch.stack([p.argmax(dim=1) for p in parts], dim=1) + self.start
        return a.reshape([n] + self.shape)


class ModeActions(nn.Module):
    """A feed-forward actor-critic's most likely action of each observation: normalised observations -> the
    network's policy head -> :class:`_Actions`."""

    def __init__(self, net: nn.Module, spec: ActionSpec, norm: Normalization | None):
        super().__init__()
        self.net, self.normalize, self.actions = net, Normalize(norm), _Actions(spec)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out, _ = self.net(self.normalize(obs))
        return self.actions(out)


class RecurrentModeActions(ModeActions):
    """A recurrent actor-critic one step: ``(obs [N, ...], h [N, H], c [N, H], first [N] bool)`` -> ``(actions, h,
    c)``; the core's state is zeroed first where ``first`` (an episode starts at this observation)."""

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor,  # type: ignore[override]
                first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, _, h2, c2 = self.net.unroll(self.normalize(obs)[None], h, c, first[None])
        return self.actions(out[0]), h2, c2


class TeamGreedy(nn.Module):
    """QMIX's agents one step, greedy over the available actions: ``(obs [N, n, ...], avail [N, n, A] bool,
    last [N, n, A] one-hot last actions (zeros at an episode's start), h [N, n, H])`` -> ``(actions [N, n], h)``.
    Every agent runs the shared network on its observation, its last action and its one-hot id."""

    def __init__(self, agent_net: nn.Module, n_actions: int):
        super().__init__()
        self.agent, self.n_actions = agent_net, n_actions

    def forward(self, obs: torch.Tensor, avail: torch.Tensor, last: torch.Tensor, h: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        from mpirl.agents.qmix_networks import agent_inputs, mask_unavailable
        e, n = obs.shape[0], obs.shape[1]
        x = agent_inputs(obs.reshape(e, n, -1), last)
        q, h2 = self.agent.step(x.reshape(e * n, -1), h.reshape(e * n, -1))
        q = mask_unavailable(q.view(e, n, -1), avail.bool(), float("-inf"))
        return q.argmax(dim=2), h2.view(e, n, -1)
