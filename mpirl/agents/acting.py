"""An Ape-X actor's copy of the Q-network: its greedy actions and the initial priorities of what it sends.

On vector observations (``agent.network`` "mlp", or "auto" on a vector) the copy is :class:`MLPActing`, the dueling
MLP of :class:`~mpirl.agents.networks.DuelingMLP` (and :class:`~mpirl.agents.networks.FlatMLP`) computed in numpy,
so the rank never imports torch: an actor starts about 1.6 CPU-s sooner (torch's import on this project's machine),
holds about 190 MB less resident memory (a process with an actor's imports: 65 MB, 254 MB with torch), and its small
forward passes skip torch's per-call overhead. The convolutions
keep torch's :class:`~mpirl.agents.dqn.ActingPolicy`. :func:`acting_policy` picks; both take the flat float32
parameter vector the learner broadcasts (``load_flat``), in the order of the torch module's ``parameters()``.

The numbers are the torch network's in float32 to rounding (``tests/test_acting.py`` holds each to the other):
numpy's matrix products run in OpenBLAS, torch's in MKL, so a greedy action may differ where two actions' values
are within rounding of each other, as it may between two CPUs.
"""

from __future__ import annotations

import math

import numpy as np

from mpirl.agents.flat_views import flat_views
from mpirl.agents.network_choice import network_for


def acting_policy(obs_shape: tuple[int, ...], n_actions: int, agent_cfg):
    """The actor's copy of the job's Q-network: numpy for the MLP, torch for the convolutions."""
    if network_for(tuple(obs_shape), agent_cfg.network) == "mlp":
        return MLPActing(obs_shape, n_actions, agent_cfg.hidden)
    import torch

    from mpirl.agents.dqn import ActingPolicy
    torch.set_num_threads(1)  # an actor's or a worker's forward passes: one thread
    return ActingPolicy(obs_shape, n_actions, agent_cfg)


def mlp_shapes(obs_dim: int, n_actions: int, hidden: list[int]) -> list[tuple[int, ...]]:
    """The dueling MLP's parameter shapes in the torch module's order: each torso layer's weight (out, in) and bias,
    then the value stream's two layers, then the advantage stream's."""
    shapes: list[tuple[int, ...]] = []
    width = obs_dim
    for h in hidden[:-1]:
        shapes += [(h, width), (h,)]
        width = h
    stream = hidden[-1]
    for out in (1, n_actions):  # value, advantage
        shapes += [(stream, width), (stream,), (out, stream), (out,)]
    return shapes


class MLPActing:
    """The dueling MLP in numpy, loaded from the broadcast's flat vector: Q(s, a) = V(s) + A(s, a) - mean_a A(s, a)
    after ReLU layers of ``hidden``; observations of any shape are flattened into float32 vectors, as
    :class:`~mpirl.agents.networks.FlatMLP` does."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, hidden: list[int]):
        self.n_actions = n_actions
        shapes = mlp_shapes(int(math.prod(obs_shape)), n_actions, list(hidden))
        self.flat, views = flat_views(shapes)
        self.n_params = len(self.flat)
        layers = list(zip(views[0::2], views[1::2]))  # (weight, bias) each
        self.torso, self.value, self.advantage = layers[:-4], layers[-4:-2], layers[-2:]

    def load_flat(self, params: np.ndarray) -> None:
        if params.shape != self.flat.shape:
            raise ValueError(f"{params.shape[0]:,} parameters for a network of {self.n_params:,}")
        np.copyto(self.flat, params)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q of each observation in a batch ``(k, *obs_shape)``: ``(k, n_actions)`` float32."""
        x = np.asarray(obs).reshape(len(obs), -1).astype(np.float32, copy=False)
        for w, b in self.torso:
            x = np.maximum(x @ w.T + b, 0.0)
        (w1, b1), (w2, b2) = self.value
        value = np.maximum(x @ w1.T + b1, 0.0) @ w2.T + b2
        (w1, b1), (w2, b2) = self.advantage
        adv = np.maximum(x @ w1.T + b1, 0.0) @ w2.T + b2
        return value + adv - adv.mean(axis=1, keepdims=True)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """The best action of each observation in a batch ``(k, *obs_shape)``."""
        return self.q_values(obs).argmax(axis=1)

    def priorities(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Initial priorities |TD| with the double-DQN n-step target, the actor's one network as online and target
        (as :func:`~mpirl.agents.dqn.td_errors` with ``target = online``): one pass over obs and next_obs."""
        n = len(batch["action"])
        q = self.q_values(np.concatenate([batch["obs"], batch["next_obs"]]))
        rows = np.arange(n)
        taken, after = q[rows, batch["action"]], q[n:]
        next_q = after[rows, after.argmax(axis=1)]
        target = batch["reward"] + batch["discount"] * (~batch["done"]).astype(np.float32) * next_q
        return np.abs(target - taken).astype(np.float32, copy=False)
