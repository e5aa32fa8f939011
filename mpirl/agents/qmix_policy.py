"""An actor's side of QMIX: the epsilon schedule and the agent network's epsilon-greedy joint actions over
many games at once, keeping each game's GRU state; numpy in, numpy out, no MPI, no torch.

The agent network is :class:`~mpirl.agents.qmix_networks.AgentNet` (fc -> ReLU -> GRU -> fc) computed in numpy
from the flat float32 vector the learner broadcasts, in the torch module's ``parameters()`` order, so an actor (or an
inference worker) never imports torch: an actor of a short job spent 1.3-2.1 CPU-s less and held about 195 MB less
(measured: docs/performance.md). The numbers are
the torch network's to float32 rounding (``tests/test_qmix.py`` holds the Q-values to the learner's sequence pass).
"""

from __future__ import annotations

import numpy as np

from mpirl.agents.flat_views import flat_views


def epsilon_schedule(step: int, start: float = 1.0, finish: float = 0.05, anneal_steps: int = 50_000) -> float:
    """PyMARL's linear decay from ``start`` to ``finish`` over ``anneal_steps`` env steps, flat after."""
    if anneal_steps <= 0:
        return finish
    frac = min(max(step, 0) / anneal_steps, 1.0)
    return start + frac * (finish - start)


def agent_input_dim(obs_dim: int, n_actions: int, n_agents: int) -> int:
    """Width of one agent's input: flat observation + one-hot last action + one-hot agent id."""
    return obs_dim + n_actions + n_agents


def agent_net_shapes(input_dim: int, n_actions: int, hidden: int) -> list[tuple[int, ...]]:
    """The agent network's parameter shapes in the torch module's order: ``fc1`` (weight, bias), the GRU's
    ``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh`` (gates r, z, n stacked), ``fc2``."""
    H = hidden
    return [(H, input_dim), (H,), (3 * H, H), (3 * H, H), (3 * H,), (3 * H,), (n_actions, H), (n_actions,)]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


class QMixPolicy:
    """An actor's copy of the agent network: epsilon-greedy joint actions for ``E`` envs at once, numpy in/out.

    Keeps each env's GRU hidden state ``h`` ``[E, n, H]`` and last actions ``last`` (one-hot ``[E, n, A]``) between
    calls; ``reset`` starts all envs afresh, ``reset_envs`` those whose episode restarted (call it before acting on
    their first step).
    """

    def __init__(self, n_agents: int, obs_shape, n_actions: int, hidden: int = 64):
        self.n_agents, self.n_actions, self.hidden = n_agents, n_actions, hidden
        self.obs_dim = int(np.prod(obs_shape))
        shapes = agent_net_shapes(agent_input_dim(self.obs_dim, n_actions, n_agents), n_actions, hidden)
        self.flat, views = flat_views(shapes)
        self.n_params = len(self.flat)
        (self.w1, self.b1, self.w_ih, self.w_hh, self.b_ih, self.b_hh, self.w2, self.b2) = views
        self.ids = np.eye(n_agents, dtype=np.float32)
        self.reset(1)

    def load_flat(self, params: np.ndarray) -> None:
        if np.shape(params) != (self.n_params,):
            raise ValueError(f"{np.shape(params)[0]:,} parameters for an agent network of {self.n_params:,}")
        np.copyto(self.flat, params, casting="same_kind")

    def reset(self, n_envs: int) -> None:
        self.h = np.zeros((n_envs, self.n_agents, self.hidden), np.float32)
        self.last = np.zeros((n_envs, self.n_agents, self.n_actions), np.float32)

    def reset_envs(self, idx) -> None:
        self.h[idx] = 0.0
        self.last[idx] = 0.0

    def q_values(self, obs: np.ndarray, rows=slice(None)) -> np.ndarray:
        """Advance the hidden state of env ``rows`` (all by default) on their ``obs`` ``[E, n, *obs_shape]``;
        Q ``[E, n, A]`` float32 (last actions unchanged)."""
        E, n = obs.shape[:2]
        x = np.concatenate([np.asarray(obs).reshape(E, n, self.obs_dim).astype(np.float32, copy=False),
                            self.last[rows], np.broadcast_to(self.ids, (E, n, n))], axis=2).reshape(E * n, -1)
        h = self.h[rows].reshape(E * n, -1)
        x = np.maximum(x @ self.w1.T + self.b1, 0.0)
        gi, gh = x @ self.w_ih.T + self.b_ih, h @ self.w_hh.T + self.b_hh
        H = self.hidden
        r = _sigmoid(gi[:, :H] + gh[:, :H])
        z = _sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
        cand = np.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
        h = (1.0 - z) * cand + z * h
        self.h[rows] = h.reshape(E, n, -1)
        return (h @ self.w2.T + self.b2).reshape(E, n, -1)

    def greedy(self, obs: np.ndarray, avail: np.ndarray, rows=slice(None)) -> np.ndarray:
        """Each agent's best available action ``[E, n]`` int64 for env ``rows`` (advances their hidden state); an
        agent with no available action (padding) picks among all."""
        avail = np.asarray(avail, dtype=bool)
        usable = avail | ~avail.any(axis=-1, keepdims=True)
        q = np.where(usable, self.q_values(obs, rows), -np.inf)
        return q.argmax(axis=2).astype(np.int64)

    def chose(self, actions: np.ndarray, rows=slice(None)) -> None:
        """Env ``rows`` took ``actions``: their next inputs carry them as last actions."""
        self.last[rows] = np.eye(self.n_actions, dtype=np.float32)[np.asarray(actions)]

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
