"""Q-networks. The torso is chosen from the observation shape: an MLP for vectors,
the Nature-DQN convolutions for stacked frames."""

from __future__ import annotations

from typing import Callable, TypeVar

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


class NatureCNN(nn.Module):
    """Stacked frames: the Nature-DQN conv torso (Mnih et al. 2015), then a dueling head.

    Input ``(B, C, 84, 84)`` raw pixel values (uint8 0..255; scaled by 1/255 here, so
    replay and messages keep uint8). Convs 32x8x8/4, 64x4x4/2, 64x3x3/1 with ReLU ->
    ``(B, 64, 7, 7)`` -> flatten 3136 -> value and advantage streams of width ``hidden``.
    Output ``(B, n_actions)`` float32. With C=4, hidden=512 and 4 actions: 3,292,837
    parameters (13.2 MB as float32).
    """

    def __init__(self, obs_shape: tuple[int, int, int], n_actions: int, hidden: int = 512):
        super().__init__()
        channels = obs_shape[0]
        self.torso = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():  # 3136 for 84x84; computed so other frame sizes work too
            features = self.torso(torch.zeros(1, *obs_shape)).shape[1]
        self.head = DuelingHead(features, n_actions, hidden)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(obs.float() / 255.0))


def build_network(obs_shape: tuple[int, ...], n_actions: int, hidden: list[int]) -> nn.Module:
    """DuelingMLP for vector observations; NatureCNN for ``(C, H, W)`` frame stacks.

    For frames the conv torso is fixed and only ``hidden[-1]`` is used, as the width of the
    value and advantage streams (512 in the Nature/Ape-X network: set ``hidden = [512]``).
    """
    if len(obs_shape) == 1:
        return DuelingMLP(obs_shape[0], n_actions, hidden)
    if len(obs_shape) == 3:
        return NatureCNN(tuple(obs_shape), n_actions, hidden[-1])
    raise ValueError(f"no network for observations of shape {obs_shape} (vectors or (C, H, W) frame stacks)")


T = TypeVar("T")


def shapes_only(build: Callable[[], T]) -> T:
    """``build()`` with every tensor it makes on torch's meta device: shapes and parameter counts, no memory.

    The memory estimates count a job's networks this way, so a network of many GB is refused by its size
    before anything allocates it (and a shape no layer takes still raises, as it would for real)."""
    with torch.device("meta"):
        return build()


def parameter_count(*modules: nn.Module | None) -> int:
    """Parameters of ``modules`` (None ones skipped), real or on the meta device."""
    return sum(p.numel() for m in modules if m is not None for p in m.parameters())
