"""Partially observed tasks: CartPole-v1 with its velocities hidden (``CartPoleNoVelocity-v1``: the cart's position
and the pole's angle only), where one observation does not hold the state and a policy must remember (an LSTM core:
``agent.recurrent = "lstm"``). Registered with Gymnasium when :mod:`mpirl.envs.factory` meets the id."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

KEEP = (0, 2)  # CartPole's x and theta; its x_dot and theta_dot are hidden


class HideVelocities(gym.ObservationWrapper):
    """CartPole's observation without its two velocities."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        box = env.observation_space
        self.observation_space = gym.spaces.Box(box.low[list(KEEP)], box.high[list(KEEP)], dtype=box.dtype)

    def observation(self, observation):
        return np.asarray(observation)[list(KEEP)]


def cartpole_no_velocity(**kwargs) -> gym.Env:
    return HideVelocities(gym.make("CartPole-v1", **kwargs).unwrapped)


IDS = {"CartPoleNoVelocity-v1": dict(entry_point="mpirl.envs.masked:cartpole_no_velocity", max_episode_steps=500,
                                     reward_threshold=475.0)}


def register() -> None:
    for env_id, kwargs in IDS.items():
        if env_id not in gym.envs.registry:
            gym.register(env_id, **kwargs)
