"""Registered environments with the spaces the sampling policies take or refuse: Dict actions (refused), MultiDiscrete
actions and a Dict observation (flattened), a Box whose bounds are infinite, and CartPole with Discrete(start=1)."""

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv


class _Short(gym.Env):
    """Ten steps of one observation; the reward says how far each action was from what ``target`` wants."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space):
        self.observation_space, self.action_space = observation_space, action_space
        self.t = 0
        self.taken: list = []  # what the env received, to check the clipping and the shift

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.taken.append(action)
        self.t += 1
        return self.observation_space.sample(), self.reward(action), self.t >= 10, False, {}

    def reward(self, action) -> float:
        return 0.0


class DictActions(_Short):
    def __init__(self):
        super().__init__(gym.spaces.Box(-1, 1, (3,), np.float32),
                         gym.spaces.Dict({"move": gym.spaces.Discrete(3), "speed": gym.spaces.Box(0, 1, (1,))}))


class MultiDiscreteActions(_Short):
    """Two dimensions of 3 and 4 choices; the reward pays 1 for each dimension at its last choice."""

    def __init__(self):
        super().__init__(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.MultiDiscrete([3, 4]))

    def reward(self, action) -> float:
        return float(action[0] == 2) + float(action[1] == 3)


class DictObservation(_Short):
    def __init__(self):
        super().__init__(gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,), np.float32),
                                          "b": gym.spaces.Discrete(3)}), gym.spaces.Discrete(2))


class UnboundedBox(_Short):
    """Actions of shape (2, 2), unbounded; the reward is minus the squared distance of the action from 3."""

    def __init__(self):
        super().__init__(gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-np.inf, np.inf, (2, 2), np.float32))

    def reward(self, action) -> float:
        return -float(np.square(np.asarray(action) - 3.0).sum())


class ClippedBox(_Short):
    """Actions in [-1, 1]^2; the reward is minus the squared distance of the action (as received) from 0.5."""

    def __init__(self):
        super().__init__(gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32))

    def reward(self, action) -> float:
        assert np.all(np.abs(action) <= 1), action
        return -float(np.square(np.asarray(action) - 0.5).sum())


class StartOneCartPole(gym.ActionWrapper):
    """CartPole whose actions are 1 and 2 (Discrete(2, start=1))."""

    def __init__(self, **kwargs):
        super().__init__(CartPoleEnv(**kwargs))
        self.action_space = gym.spaces.Discrete(2, start=1)

    def action(self, action):
        assert action in (1, 2), action
        return int(action) - 1


gym.register("DictActions-v0", entry_point=DictActions)
gym.register("MultiDiscreteActions-v0", entry_point=MultiDiscreteActions)
gym.register("DictObservation-v0", entry_point=DictObservation)
gym.register("UnboundedBox-v0", entry_point=UnboundedBox)
gym.register("ClippedBox-v0", entry_point=ClippedBox)
gym.register("StartOneCartPole-v0", entry_point=StartOneCartPole, max_episode_steps=500)
