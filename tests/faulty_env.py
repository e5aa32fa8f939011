"""A registered environment that raises after a number of steps: a rank that fails mid-run."""

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class FaultyCartPole(CartPoleEnv):
    steps = 0

    def step(self, action):
        FaultyCartPole.steps += 1
        if FaultyCartPole.steps > 3000:
            raise RuntimeError("injected failure in env.step")
        return super().step(action)


gym.register("FaultyCartPole-v0", entry_point=FaultyCartPole, max_episode_steps=500)
