"""An actor's side of QMIX: the epsilon schedule and the agent network's epsilon-greedy joint actions over
many games at once, keeping each game's GRU state; numpy in, numpy out, no MPI."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mpirl.agents.qmix_networks import AgentNet, agent_input_dim, agent_inputs, mask_unavailable


def epsilon_schedule(step: int, start: float = 1.0, finish: float = 0.05, anneal_steps: int = 50_000) -> float:
    """PyMARL's linear decay from ``start`` to ``finish`` over ``anneal_steps`` env steps, flat after."""
    if anneal_steps <= 0:
        return finish
    frac = min(max(step, 0) / anneal_steps, 1.0)
    return start + frac * (finish - start)


class QMixPolicy:
    """An actor's copy of the agent network: epsilon-greedy joint actions for ``E`` envs at once, numpy in/out.

    Keeps each env's GRU hidden state ``[E, n, H]`` and last actions between calls; ``reset`` starts all
    envs afresh, ``reset_envs`` those whose episode restarted (call it before acting on their first step).
    """

    def __init__(self, n_agents: int, obs_shape, n_actions: int, hidden: int = 64):
        self.n_agents, self.n_actions, self.hidden = n_agents, n_actions, hidden
        self.obs_dim = int(np.prod(obs_shape))
        self.net = AgentNet(agent_input_dim(self.obs_dim, n_actions, n_agents), n_actions, hidden)
        self.net.requires_grad_(False)
        self.n_params = sum(p.numel() for p in self.net.parameters())
        self.reset(1)

    def load_flat(self, params: np.ndarray) -> None:
        torch.nn.utils.vector_to_parameters(torch.as_tensor(params, dtype=torch.float32), self.net.parameters())

    def reset(self, n_envs: int) -> None:
        self.h = torch.zeros(n_envs, self.n_agents, self.hidden)
        self.last = torch.zeros(n_envs, self.n_agents, self.n_actions)

    def reset_envs(self, idx) -> None:
        self.h[idx] = 0.0
        self.last[idx] = 0.0

    @torch.no_grad()
    def q_values(self, obs: np.ndarray, rows=slice(None)) -> torch.Tensor:
        """Advance the hidden state of env ``rows`` (all by default) on their ``obs`` ``[E, n, *obs_shape]``;
        Q ``[E, n, A]`` (last actions unchanged)."""
        E, n = obs.shape[:2]
        x = agent_inputs(torch.as_tensor(obs).reshape(E, n, self.obs_dim), self.last[rows])
        q, h = self.net.step(x.reshape(E * n, -1), self.h[rows].reshape(E * n, -1))
        self.h[rows] = h.view(E, n, -1)
        return q.view(E, n, -1)

    def greedy(self, obs: np.ndarray, avail: np.ndarray, rows=slice(None)) -> np.ndarray:
        """Each agent's best available action ``[E, n]`` int64 for env ``rows`` (advances their hidden state)."""
        q = mask_unavailable(self.q_values(obs, rows), torch.as_tensor(np.asarray(avail, dtype=bool)), float("-inf"))
        return q.argmax(dim=2).numpy().astype(np.int64)

    def chose(self, actions: np.ndarray, rows=slice(None)) -> None:
        """Env ``rows`` took ``actions``: their next inputs carry them as last actions."""
        self.last[rows] = F.one_hot(torch.from_numpy(actions), self.n_actions).float()

    def act(self, obs: np.ndarray, avail: np.ndarray, epsilon: float, rng: np.random.Generator,
            greedy: bool = False) -> np.ndarray:
        """Actions ``[E, n]`` int64: each agent's best available action, or with probability ``epsilon``
        (per agent, ignored when ``greedy``) a uniformly random available one."""
        actions = self.greedy(obs, avail)
        if not greedy:
            actions = explore(actions, avail, epsilon, rng)
        self.chose(actions)
        return actions


def explore(actions: np.ndarray, avail: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Epsilon-greedy over ``actions`` ``[E, n]``: each agent with probability ``epsilon`` takes a uniformly
    random available action instead."""
    if epsilon <= 0:
        return actions
    avail = np.asarray(avail, dtype=bool)
    keys = np.where(avail, rng.random(avail.shape), -1.0)
    random = keys.argmax(axis=2)
    take = rng.random(actions.shape) < epsilon
    return np.where(take, random, actions).astype(np.int64)
