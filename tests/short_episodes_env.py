"""A registered environment whose every episode is one step long, its return the number of episodes the process
has finished before it, in thousands: returns rise steadily as a job runs, so a window of them says how recent its
episodes are (``tests/test_episode_tally.py``)."""

import gymnasium as gym
import numpy as np


class OneStep(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)
    finished = 0  # episodes of this process, over all its games

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        OneStep.finished += 1
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, OneStep.finished / 1000.0, True, False, {}


gym.register("OneStep-v0", entry_point=OneStep, max_episode_steps=10)
