"""A trained policy outside its job: actions for observations, in one process without MPI (``mpirl play``,
``mpirl export``, ``mpirl.load_policy``). Each algorithm builds its own from a checkpoint
(``mpirl/algos/<name>/trained.py``); they all answer the same calls:

* ``act(obs, state=None, episode_start=None, deterministic=True)`` -> ``(actions, state)``: a batch of observations
  (or one) to the environment's actions, as Stable-Baselines3's ``predict`` does; a recurrent policy's ``state`` is
  what the last call returned (None: episodes start here), zeroed where ``episode_start``;
* ``game(seed, render)``: one game of the job's environment with the job's settings (:mod:`mpirl.envs.watched`);
* ``module()``: the deterministic policy as one torch module (:mod:`mpirl.agents.deployed`), what export traces.

:class:`SingleAgentPolicy` serves every single-agent network (Ape-X's Q-network, IMPALA's and the gradient family's
actor-critics): the deterministic actions come from the module itself, so what plays is what is exported.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch
from torch import nn

from mpirl.agents.distributions import actor_outputs
from mpirl.agents.sampling import sample
from mpirl.envs.actions import ActionSpec
from mpirl.envs.watched import single_game


class TrainedPolicy(ABC):
    """What every trained policy answers (see the module docstring). ``obs_shape``: one observation as the job's
    games give it; ``recurrent``: whether ``act`` carries a state."""

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    recurrent: bool = False
    stochastic: bool = False  # whether deterministic=False samples (an actor-critic's distribution)
    source: str = ""  # what it was loaded from, in words: "ckpt-0000001244.pt (train step 1244)"

    def __init__(self, cfg, device: torch.device | str = "cpu"):
        self.cfg, self.device = cfg, torch.device(device)

    @abstractmethod
    def act(self, obs, state: Any = None, episode_start=None, deterministic: bool = True,
            rng: np.random.Generator | None = None) -> tuple[np.ndarray, Any]:
        """The actions of ``obs`` and the state to pass next (None for a feed-forward policy)."""

    @abstractmethod
    def game(self, seed: int, render: bool):
        """One game of the job's environment (:mod:`mpirl.envs.watched`)."""

    def module(self) -> nn.Module:
        """The deterministic policy as a torch module (observations -> actions)."""
        raise NotImplementedError(f"{self.cfg.agent.algorithm}'s policy cannot be exported yet")

    def batched(self, obs) -> tuple[np.ndarray, bool]:
        """``obs`` as a batch, and whether it was one observation."""
        a = np.asarray(obs)
        one = a.shape == tuple(self.obs_shape)
        if not one and a.shape[1:] != tuple(self.obs_shape):
            raise ValueError(f"observations of shape {a.shape}; this policy takes {tuple(self.obs_shape)} or a batch "
                             f"(N, {', '.join(map(str, self.obs_shape))}) as the job's games give them")
        return (a[None] if one else a), one


class SingleAgentPolicy(TrainedPolicy):
    """A single-agent network: ``actions`` is its :mod:`~mpirl.agents.deployed` module; ``net``: the actor-critic
    (None for a Q-network) whose distribution ``deterministic=False`` samples from."""

    def __init__(self, cfg, actions: nn.Module, obs_shape, obs_dtype, spec: ActionSpec | None = None,
                 net: nn.Module | None = None, device: torch.device | str = "cpu"):
        super().__init__(cfg, device)
        self.actions = actions.to(self.device).eval()
        self.actions.requires_grad_(False)
        self.obs_shape, self.obs_dtype, self.spec = tuple(obs_shape), np.dtype(obs_dtype), spec
        self.net = net
        self.recurrent = net is not None and getattr(net, "core", None) is not None
        self.stochastic = net is not None
        self.state_size = int(getattr(net, "state_size", 0)) if self.recurrent else 0

    def initial_state(self, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        """A recurrent policy's state before any step of ``n`` games (zeros)."""
        return (np.zeros((n, self.state_size), np.float32),) * 2 if self.recurrent else None

    @torch.no_grad()
    def act(self, obs, state: Any = None, episode_start=None, deterministic: bool = True,
            rng: np.random.Generator | None = None) -> tuple[np.ndarray, Any]:
        batch, one = self.batched(obs)
        x = torch.as_tensor(batch, device=self.device)
        n = len(batch)
        first = np.ones(n, bool) if state is None else np.zeros(n, bool)
        if episode_start is not None:
            first |= np.asarray(episode_start, bool).reshape(n)
        h, c = state if state is not None else (self.initial_state(n) or (None, None))
        if deterministic or not self.stochastic:
            if self.recurrent:
                a, h2, c2 = self.actions(x, torch.as_tensor(h, device=self.device),
                                         torch.as_tensor(c, device=self.device),
                                         torch.as_tensor(first, device=self.device))
                state = (h2.cpu().numpy(), c2.cpu().numpy())
            else:
                a = self.actions(x)
            actions = a.cpu().numpy()
        else:
            actions, state = self._sample(x, h, c, first, rng or np.random.default_rng())
        return (actions[0] if one else actions), (state if self.recurrent else None)

    def _sample(self, x: torch.Tensor, h, c, first: np.ndarray, rng: np.random.Generator):
        """Actions drawn from the policy's distribution as the actors draw them, as the environment takes them."""
        assert self.net is not None and self.spec is not None
        z = self.actions.normalize(x)
        state = None
        if self.recurrent:
            out, _, h2, c2 = self.net.unroll(z[None], torch.as_tensor(h, device=self.device),
                                             torch.as_tensor(c, device=self.device),
                                             torch.as_tensor(first, device=self.device)[None])
            out, state = out[0], (h2.cpu().numpy(), c2.cpu().numpy())
        else:
            out, _ = self.net(z)
        log_std = None if self.net.log_std is None else self.net.log_std.detach().double().cpu().numpy()
        stored, _ = sample(self.spec, actor_outputs(self.spec, out), log_std, rng)
        return np.stack([np.asarray(self.spec.to_env(a)) for a in stored]), state

    def game(self, seed: int, render: bool):
        return single_game(self.cfg.env, seed, render)

    def module(self) -> nn.Module:
        return self.actions
