"""Episodes of a trained policy, one game at a time, in this process: what ``mpirl play`` prints and records.

Episode ``k`` starts from a reset seeded with ``SeedSequence([seed, k + 1])``: the same ``--seed`` plays the same episodes
(a deterministic policy on a deterministic env gives the same returns). A recorded video holds one frame per step,
the picture the policy acted on (so its frames are the episodes' steps, summed)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

MAX_STEPS = 108_000  # steps of one episode at most (30 minutes of Atari play): an episode cut there is not counted


@dataclass
class Played:
    """What the episodes gave: each one's return and length (the finished ones), the frames recorded."""
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    frames: int = 0
    unfinished: int = 0

    def line(self) -> str:
        """``return 500.0 +- 0.0 (min 500.0, max 500.0), length 500.0 over 10 episodes``."""
        if not self.returns:
            return f"no episode finished within {MAX_STEPS:,} steps"
        r = np.asarray(self.returns)
        cut = f"; {self.unfinished} cut at {MAX_STEPS:,} steps, not counted" if self.unfinished else ""
        return (f"return {r.mean():.1f} +- {r.std():.1f} (min {r.min():.1f}, max {r.max():.1f}), length "
                f"{np.mean(self.lengths):.1f} over {len(r)} episode{'s' * (len(r) != 1)}{cut}")

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns)) if self.returns else math.nan


def episode_seed(seed: int, k: int) -> int:
    """The reset seed of episode ``k`` (from 0) of ``--seed``."""
    return int(np.random.SeedSequence([int(seed), 1 + int(k)]).generate_state(1)[0] % 2**31)


def game_seed(seed: int) -> int:
    """The seed the game is made with (its action space's, and a first reset's)."""
    return int(np.random.SeedSequence([int(seed), 0]).generate_state(1)[0] % 2**31)


def play(policy, episodes: int, seed: int = 0, deterministic: bool = True,
         frame: Callable[[np.ndarray], None] | None = None) -> Played:
    """``episodes`` episodes of ``policy`` (a :class:`~mpirl.agents.trained_policy.TrainedPolicy`) on one game of
    its job's env; ``frame``: called with each step's picture (the game renders only then)."""
    out = Played()
    rng = np.random.default_rng(seed)
    game = policy.game(game_seed(seed), render=frame is not None)
    try:
        for k in range(episodes):
            obs = game.reset(episode_seed(seed, k))
            state, start, total, steps, done = None, True, 0.0, 0, False
            while not done and steps < MAX_STEPS:
                if frame is not None:
                    frame(game.frame())
                    out.frames += 1
                action, state = policy.act(obs, state, episode_start=start, deterministic=deterministic, rng=rng)
                obs, reward, done = game.step(action)
                total, steps, start = total + reward, steps + 1, False
            if done:
                out.returns.append(total)
                out.lengths.append(steps)
            else:
                out.unfinished += 1
    finally:
        game.close()
    return out
