"""A MinAtar game as a Gymnasium environment, for the reference libraries' runs (RLlib's and Sample Factory's venvs).

Runs inside a reference venv (:mod:`mpirl.bench.reference_venv`), so it imports nothing of mpirl; it works with
the Gymnasium of either (1.2.2 for RLlib, 0.29 for Sample Factory). The game is ``minatar.Environment(game)`` with
MinAtar's own defaults, as mpirl's ``MinAtar/<Game>-v1`` has them: sticky actions (probability 0.1) and difficulty
ramping. Observations are its ``10 x 10 x C`` planes (channels last, Breakout's 4: paddle, ball, trail, bricks)
as float32 0/1; actions are the game's minimal action set (Breakout's 3: no-op, left, right) through
``minimal_action_set()``, as ``-v1`` ids do. An episode is terminated when MinAtar says the game is over (in
Breakout, the ball passed the paddle); nothing is truncated: no time limit (mpirl's ``MinAtar/Breakout-v1``
has none either).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

PREFIX = "MinAtar/"


def game_of(env_id: str) -> str:
    """MinAtar's game name of an id such as ``MinAtar/Breakout-v1`` (``breakout``; ``SpaceInvaders``:
    ``space_invaders``)."""
    name = env_id[len(PREFIX):].rsplit("-v", 1)[0]
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


class MinAtarEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, game: str = "breakout"):
        import minatar
        self.game = minatar.Environment(game)
        self.actions = list(self.game.minimal_action_set())
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=tuple(self.game.state_shape()), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(len(self.actions))

    def _obs(self) -> np.ndarray:
        return self.game.state().astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.game.seed(seed)  # MinAtar's generator: the game's randomness and its sticky actions
        self.game.reset()
        return self._obs(), {}

    def step(self, action):
        reward, terminal = self.game.act(self.actions[int(action)])
        return self._obs(), float(reward), bool(terminal), False, {}


def make(env_id: str) -> MinAtarEnv:
    return MinAtarEnv(game_of(env_id))
