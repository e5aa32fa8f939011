"""Q-networks. The torso is chosen from the observation shape (``agent.network = "auto"``): an MLP
for vectors, MinAtar's one-convolution network for small images, the Nature-DQN convolutions for
84x84 frame stacks; a job may name one. Every one ends in a dueling head.

Images arrive channels first, ``(C, H, W)``, as stored: ``uint8`` pixels are scaled by 1/255
here (replay and messages keep bytes), ``bool`` planes (MinAtar) are taken as 0/1."""

from __future__ import annotations

import math
from typing import Callable, TypeVar

import torch
from torch import nn

from mpirl.agents.network_choice import network_for
from mpirl.agents.running_stats import PIXEL_SCALE
from mpirl.agents.tensors import floats


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
        return self.head(self.torso(floats(obs)))


def image_floats(obs: torch.Tensor) -> torch.Tensor:
    """Stored image observations as the convolutions take them: uint8 pixels / 255, anything else as is. (The
    scaling is a multiply in place on the new float tensor: one pass over it, not a second tensor. Observations the
    job normalises, ``agent.normalize_obs``, arrive as floats already scaled and normalised.)"""
    return floats(obs).mul_(PIXEL_SCALE) if obs.dtype == torch.uint8 else floats(obs)


def nature_floats(obs: torch.Tensor) -> torch.Tensor:
    """:func:`image_floats` for the Nature convolutions, channels-last in memory for a pass a gradient will flow
    back through on the CPU, where oneDNN's backward convolutions are much faster on that layout (the whole pass
    1.54x at IMPALA's batch: ``mpirl bench learner``'s layout row); the forward gains nothing and inference at
    large batches loses, so acting keeps the stored layout, and CUDA is left as it is. The bytes are reordered
    before they become floats, a quarter of the memory traffic of reordering the floats. The values, and the
    flattened features after the torso, are the same in either layout."""
    if obs.dim() == 4 and obs.device.type == "cpu" and torch.is_grad_enabled():
        obs = obs.contiguous(memory_format=torch.channels_last)  # .float() keeps the layout
    return image_floats(obs)


class MinAtarCNN(nn.Module):
    """Small images: the network MinAtar's authors use for DQN (Young & Tian 2019), with a dueling head.

    Input ``(B, C, H, W)`` -> Conv 16x3x3/1 with ReLU -> flatten (16 (H-2) (W-2); 1024 for 10x10) ->
    value and advantage streams of width ``hidden`` (128 in the paper's network). With Breakout's 4
    channels, 3 actions and hidden=128: 263,508 parameters.
    """

    def __init__(self, obs_shape: tuple[int, int, int], n_actions: int, hidden: int = 128):
        super().__init__()
        channels, height, width = obs_shape
        self.torso = nn.Sequential(nn.Conv2d(channels, 16, kernel_size=3, stride=1), nn.ReLU(), nn.Flatten())
        self.head = DuelingHead(16 * (height - 2) * (width - 2), n_actions, hidden)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(image_floats(obs)))


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
        return self.head(self.torso(nature_floats(obs)))


class FlatMLP(DuelingMLP):
    """Any observation flattened into a vector, then the MLP (``agent.network = "mlp"`` on images)."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, hidden: list[int]):
        super().__init__(int(math.prod(obs_shape)), n_actions, hidden)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return super().forward(obs.flatten(1))


def build_network(obs_shape: tuple[int, ...], n_actions: int, hidden: list[int], choice: str = "auto") -> nn.Module:
    """The Q-network :func:`network_for` picks. For images the convolutions are fixed and only ``hidden[-1]``
    is used, as the width of the value and advantage streams (512 in the Nature/Ape-X network: set
    ``hidden = [512]``; 128 in MinAtar's)."""
    kind = network_for(tuple(obs_shape), choice)
    if kind == "mlp":
        return DuelingMLP(obs_shape[0], n_actions, hidden) if len(obs_shape) == 1 else FlatMLP(obs_shape, n_actions, hidden)
    if kind == "minatar":
        return MinAtarCNN(tuple(obs_shape), n_actions, hidden[-1])
    return NatureCNN(tuple(obs_shape), n_actions, hidden[-1])


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


class NetworkCopy:
    """An actor's copy of a network, loaded from the flat float32 parameter vector a broadcast carries; no
    gradients."""

    def __init__(self, net: nn.Module):
        self.net = net
        self.net.requires_grad_(False)
        self.n_params = parameter_count(net)

    def load_flat(self, params) -> None:
        torch.nn.utils.vector_to_parameters(torch.from_numpy(params), self.net.parameters())
