"""Registered environments that raise: always after a number of steps (an actor that cannot go
on), and now and then (an actor that rebuilds its games and goes on)."""

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv
from gymnasium.envs.toy_text import TaxiEnv


def failing_after(base: type, steps: int = 3000) -> type:
    """``base`` whose ``step`` raises once the process has made ``steps`` steps with it."""
    class Failing(base):
        made = 0

        def step(self, action):
            Failing.made += 1
            if Failing.made > steps:
                raise RuntimeError("injected failure in env.step")
            return super().step(action)
    Failing.__name__ = f"Faulty{base.__name__}"
    return Failing


FaultyCartPole = failing_after(CartPoleEnv)
gym.register("FaultyCartPole-v0", entry_point=FaultyCartPole, max_episode_steps=500)


class FlakyCartPole(CartPoleEnv):
    """Raises on every 400th step of the process, then works again once rebuilt."""
    steps = 0

    def step(self, action):
        FlakyCartPole.steps += 1
        if FlakyCartPole.steps % 400 == 0:
            raise ValueError("injected flaky failure in env.step")
        return super().step(action)


gym.register("FlakyCartPole-v0", entry_point=FlakyCartPole, max_episode_steps=500)


class HugeRewardCartPole(CartPoleEnv):
    """Rewards of 1e38: finite, and so are their n-step returns, but a batch's loss overflows float32."""

    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, 1e38, terminated, truncated, info


gym.register("HugeRewardCartPole-v0", entry_point=HugeRewardCartPole, max_episode_steps=500)


# A DistQL worker that cannot go on (Taxi, its 200-step limit).
gym.register("FaultyTaxi-v0", entry_point=failing_after(TaxiEnv), max_episode_steps=200)
