"""A PettingZoo ParallelEnv module that keeps no episode limit (no ``max_cycles``): two alike agents, nothing else.

Tests load it as an env module by import path (``mpe2.endless_v0`` in ``sys.modules``) to see how a job treats an
env whose episodes have no known length."""

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class Endless(ParallelEnv):
    metadata = {"name": "endless_v0"}
    possible_agents = ["a", "b"]

    def observation_space(self, agent):
        return spaces.Box(0, 1, (3,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def close(self):
        pass


def parallel_env(**kwargs) -> Endless:
    return Endless()
