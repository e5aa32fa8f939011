"""Random play on the job's multi-agent env: the bar a learned team must clear (uniform over legal actions)."""

from __future__ import annotations

import numpy as np

from mpirl.algos.qmix.envs import make
from mpirl.config import JobConfig


def random_play(cfg: JobConfig, episodes: int = 32, seed: int = 12345) -> dict:
    """``episodes`` episodes of uniformly random legal actions: per-episode ``returns``, ``captures``,
    ``lone_catches`` (NaN where the env does not count them) and ``lengths`` as arrays."""
    from mpirl.algos.qmix.algorithm import spaces_of
    from mpirl.algos.qmix.learner import episode_stats
    rng = np.random.default_rng(seed)
    spaces = spaces_of(cfg)
    game = make(cfg, seed, spaces)
    limit = spaces.episode_limit
    out = {k: np.zeros(episodes) for k in ("returns", "captures", "lone_catches", "lengths")}
    try:
        for e in range(episodes):
            _, mask, _ = game.reset(seed=seed + e)
            ret, steps = 0.0, 0
            while True:
                keys = np.where(mask, rng.random(mask.shape), -1.0)
                step = game.step(keys.argmax(axis=1))
                ret += step.reward
                steps += 1
                mask = step.mask
                if step.terminated or step.truncated or steps >= limit:
                    break
            stats = episode_stats(game)
            out["returns"][e], out["lengths"][e] = ret, steps
            out["captures"][e] = stats.get("captures", np.nan)
            out["lone_catches"][e] = stats.get("lone_catches", np.nan)
    finally:
        game.close()
    return out


def z_score(learned: np.ndarray, random: np.ndarray) -> float:
    """Welch's z of the learned team's mean return over random play's (standard errors of both means)."""
    se = np.sqrt(learned.var(ddof=1) / len(learned) + random.var(ddof=1) / len(random))
    diff = learned.mean() - random.mean()
    return float(diff / se) if se > 0 else (np.inf if diff > 0 else 0.0)
