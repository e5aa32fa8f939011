"""Every finished episode of a reference library's run, as one line in a file: the same record for every library.

Runs inside a reference venv (:mod:`mpirl.bench.reference_venv`), so it imports nothing of mpirl, only Gymnasium.
:class:`EpisodeFile` wraps each environment the library makes; at every episode's end it appends
``wall-clock time, length, return`` to ``$MPIRL_EPISODES/<pid>.txt`` (one file per process, so the library's
worker processes never share one). :func:`crossing` reads them all back in time order and finds when the mean
return of the last 20 episodes first reached a target, as ``mpirl.bench.solve`` does for SB3.
"""

from __future__ import annotations

import glob
import os
import time

import gymnasium as gym


class EpisodeFile(gym.Wrapper):
    def __init__(self, env):
        super().__init__(env)
        self.length, self.ret = 0, 0.0
        self.path = os.path.join(os.environ["MPIRL_EPISODES"], f"{os.getpid()}.txt")

    def reset(self, **kwargs):
        self.length, self.ret = 0, 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.length += 1
        self.ret += float(reward)
        if terminated or truncated:
            with open(self.path, "a") as f:
                f.write(f"{time.time():.6f} {self.length} {self.ret:.6f}\n")
        return obs, reward, terminated, truncated, info


def make(env_id: str = "CartPole-v1"):
    """``env_id`` recorded: a Gymnasium id, or a MinAtar game's (``MinAtar/Breakout-v1``: :mod:`minatar_env`)."""
    if env_id.startswith("MinAtar/"):
        import minatar_env  # beside this file, on the path of every worker that imports this one
        return EpisodeFile(minatar_env.make(env_id))
    return EpisodeFile(gym.make(env_id))


def episodes(folder: str) -> list[tuple[float, int, float]]:
    """Every episode written under ``folder`` so far, in time order: (time, length, return)."""
    rows = []
    for path in glob.glob(os.path.join(folder, "*.txt")):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:  # a line being written is skipped until it is whole
                    rows.append((float(parts[0]), int(parts[1]), float(parts[2])))
    rows.sort()
    return rows


def crossing(rows, target: float, t0: float, window: int = 20) -> dict | None:
    """When the mean return of the last ``window`` episodes first reached ``target``: seconds since ``t0``, the env
    steps of the episodes finished by then, and their count; None if it never did."""
    steps = 0
    for i, (t, length, _) in enumerate(rows):
        steps += length
        if i + 1 >= window and sum(r for _, _, r in rows[i + 1 - window:i + 1]) / window >= target:
            return {"seconds": t - t0, "env_steps": steps, "episodes": i + 1}
    return None
