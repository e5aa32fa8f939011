"""Q-networks. The torso is chosen from the observation shape: an MLP for vectors."""

from __future__ import annotations

import torch
from torch import nn


class DuelingHead(nn.Module):
    """Q(s, a) = V(s) + A(s, a) - mean_a A(s, a) (Wang et al. 2016)."""

    def __init__(self, features: int, n_actions: int, hidden: int):
        super().__init__()
        self.value = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.advantage = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, n_actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        adv = self.advantage(x)
        return self.value(x) + adv - adv.mean(dim=1, keepdim=True)


class DuelingMLP(nn.Module):
    """Vector observations: an MLP torso with ``hidden`` widths, then a dueling head."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: list[int]):
        super().__init__()
        layers, width = [], obs_dim
        for h in hidden[:-1]:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.torso = nn.Sequential(*layers)
        self.head = DuelingHead(width, n_actions, hidden[-1])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(obs.float()))


def build_network(obs_shape: tuple[int, ...], n_actions: int, hidden: list[int]) -> nn.Module:
    if len(obs_shape) == 1:
        return DuelingMLP(obs_shape[0], n_actions, hidden)
    raise ValueError(f"no network for observations of shape {obs_shape} yet (vector observations only)")
