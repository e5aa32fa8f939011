"""Environments with finitely many states, for tabular learners: a Discrete observation space as it is, or a
Box one through a discretizer (CartPole's four observations into bins, as DistQL did).

A state is one integer in [0, n_states); the table of a learner is ``n_states x n_actions``.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from mpirl.config import ConfigError, EnvConfig
from mpirl.envs.factory import make_env

# The ranges DistQL clips CartPole's position, velocity, angle and angular velocity to before binning.
CARTPOLE_BOUNDS = ((-2.4, 2.4), (-2.0, 2.0), (-1.0, 1.0), (-3.5, 3.5))
# Box-observation envs with a discretizer: id (without a "module:" prefix) -> per-dimension bounds.
DISCRETIZERS = {"CartPole-v0": CARTPOLE_BOUNDS, "CartPole-v1": CARTPOLE_BOUNDS}


class Discretizer:
    """``np.digitize`` of each observation dimension on the interior edges of ``bins[d]`` equal bins over
    ``bounds[d]`` (values beyond a bound fall in the outer bins), then one flat index."""

    def __init__(self, bounds, bins):
        self.edges = [np.linspace(lo, hi, n + 1)[1:-1] for (lo, hi), n in zip(bounds, bins)]
        self.shape = tuple(int(n) for n in bins)
        self.n_states = int(np.prod(self.shape, dtype=np.int64))
        self._edges = [e.tolist() for e in self.edges]

    def __call__(self, obs) -> int:
        """``np.ravel_multi_index([np.digitize(x, e) for ...])``, computed with ``bisect`` on Python floats (the
        same comparisons, edges[i-1] <= x < edges[i], at a tenth of the cost for one observation)."""
        index = 0
        for x, edges, n in zip(obs.tolist(), self._edges, self.shape):
            index = index * n + bisect_right(edges, x)
        return index


@dataclass
class TabularEnv:
    """A gymnasium env with integer states: ``reset()`` and ``step(a)`` return the state index."""
    env: gym.Env
    n_states: int
    n_actions: int
    discretize: Discretizer | None
    seed: int | None = None

    def _state(self, obs) -> int:
        return self.discretize(obs) if self.discretize else int(obs)

    def reset(self) -> int:
        obs, _ = self.env.reset(seed=self.seed)
        self.seed = None  # the first reset seeds the env; later ones continue its generator
        return self._state(obs)

    def step(self, action: int):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return self._state(obs), float(reward), bool(terminated), bool(truncated)

    def rng_state(self) -> str:
        """The env's random generator state as JSON, for a checkpoint to continue it ('' before the first reset:
        the seed it was made with still decides)."""
        if self.seed is not None:
            return ""
        return json.dumps(self.env.unwrapped.np_random.bit_generator.state,
                          default=lambda a: a.tolist() if isinstance(a, np.ndarray) else str(a))

    def set_rng_state(self, text: str) -> None:
        """Continue the generator :meth:`rng_state` described: later resets draw what they would have drawn."""
        if text:
            self.env.unwrapped.np_random.bit_generator.state = json.loads(text)
            self.seed = None  # no reseeding at the next reset

    def close(self) -> None:
        self.env.close()


def discretizer_for(env_id: str, obs_space, bins) -> Discretizer | None:
    """None for a Discrete space; the env's discretizer for a Box one; a ConfigError naming env.id otherwise."""
    if isinstance(obs_space, gym.spaces.Discrete):
        return None
    bounds = DISCRETIZERS.get(env_id.split(":", 1)[-1])
    if bounds is None or not isinstance(obs_space, gym.spaces.Box) or obs_space.shape != (len(bounds),):
        known = ", ".join(sorted(DISCRETIZERS))
        raise ConfigError("env.id", f"{env_id!r} has observation space {obs_space}; a tabular learner needs a "
                                    f"Discrete one, or a Box with a discretizer ({known}); e.g. Taxi-v4")
    return Discretizer(bounds, bins)


def make_tabular_env(cfg: EnvConfig, bins, seed: int | None = None) -> TabularEnv:
    """The job's environment with integer states (ConfigError naming env.id when it has none)."""
    env = make_env(cfg, seed)
    try:
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise ConfigError("env.id", f"{cfg.id!r} has action space {env.action_space}; a tabular learner "
                                        "needs a Discrete one")
        disc = discretizer_for(cfg.id, env.observation_space, bins)
    except ConfigError:
        env.close()
        raise
    n_states = disc.n_states if disc else int(env.observation_space.n)
    return TabularEnv(env, n_states, int(env.action_space.n), disc, seed)
