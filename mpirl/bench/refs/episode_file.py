"""Every finished episode of a reference library's run, as one line in a file: the same record for every library;
and every env step its workers took, with the time of the first.

Runs inside a reference venv (:mod:`mpirl.bench.reference_venv`), so it imports nothing of mpirl, only Gymnasium.
:class:`EpisodeFile` wraps each environment the library makes; at every episode's end it appends
``wall-clock time, length, return`` to ``$MPIRL_EPISODES/<pid>.txt`` (one file per process, so the library's
worker processes never share one). It also counts the steps taken through it by every env of its process (an
Atari game's ends come a few minutes apart, so finished episodes alone say little of a short run) and keeps
``$MPIRL_EPISODES/<pid>.steps`` up to date (rewritten whole at the process's first step, then at most every
``FLUSH`` seconds): the time of the process's first step, its steps so far, and the time of that count.
:func:`steps_taken` adds them up over the processes and gives the earliest first step, which the reference scripts
start their clocks at. :func:`crossing` reads the episodes back in time order and finds when the mean return of the
last 20 episodes first reached a target, as ``mpirl.bench.solve`` does for SB3.

On an Atari game (``games=True``) the wrapper sits above the library's Atari wrappers, so it counts agent steps (4
frames each) as the library does, while an episode is the whole game, not a life, with its unclipped return: both
read from the ``info["episode"]`` that Gymnasium's ``RecordEpisodeStatistics`` beneath the wrappers reports when
the game ends (:mod:`ale_env`).
"""

from __future__ import annotations

import glob
import os
import time

import gymnasium as gym

FLUSH = 0.2  # seconds between rewrites of a process's step count
_counted = {"pid": None, "first": 0.0, "steps": 0, "written": 0.0}  # this process's steps, over all its envs


def _count() -> None:
    """One more step in this process; its ``.steps`` file rewritten at the first and then every ``FLUSH`` s."""
    now = time.time()
    if _counted["pid"] != os.getpid():  # the first step here (or in a process forked after steps were taken)
        _counted.update(pid=os.getpid(), first=now, steps=0, written=0.0)
    _counted["steps"] += 1
    if now - _counted["written"] >= FLUSH:
        _write(now)


def _write(now: float) -> None:
    if _counted["pid"] != os.getpid():
        return
    path = os.path.join(os.environ["MPIRL_EPISODES"], f"{os.getpid()}.steps")
    with open(path + ".tmp", "w") as f:
        f.write(f"{_counted['first']:.6f} {_counted['steps']} {now:.6f}\n")
    os.replace(path + ".tmp", path)  # readers see the old count or the new, never half of one
    _counted["written"] = now


class EpisodeFile(gym.Wrapper):
    """Records each episode's end and counts each step. ``games``: an episode is what the ``info["episode"]`` of a
    ``RecordEpisodeStatistics`` beneath the library's wrappers says (an Atari game: its end and unclipped return),
    not what this wrapper's own step results say (a life's end, a clipped reward)."""

    def __init__(self, env, games: bool = False):
        super().__init__(env)
        self.games = games
        self.length, self.ret = 0, 0.0
        self.path = os.path.join(os.environ["MPIRL_EPISODES"], f"{os.getpid()}.txt")

    def reset(self, **kwargs):
        if not self.games:  # a game's count goes on across the resets that follow a lost life
            self.length, self.ret = 0, 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        _count()
        self.length += 1
        if self.games:
            from ale_env import game_return  # beside this file, as minatar_env
            ret = game_return(info)
            ended = ret is not None
        else:
            self.ret += float(reward)
            ret, ended = self.ret, terminated or truncated
        if ended:
            with open(self.path, "a") as f:
                f.write(f"{time.time():.6f} {self.length} {ret:.6f}\n")
            self.length, self.ret = 0, 0.0
        return obs, reward, terminated, truncated, info

    def close(self):
        _write(time.time())
        return super().close()


def make(env_id: str = "CartPole-v1"):
    """``env_id`` recorded: a Gymnasium id, or a MinAtar game's (``MinAtar/Breakout-v1``: :mod:`minatar_env`).
    Atari games are wrapped by each library's own Atari wrappers first (the reference scripts)."""
    if env_id.startswith("MinAtar/"):
        import minatar_env  # beside this file, on the path of every worker that imports this one
        return EpisodeFile(minatar_env.make(env_id))
    return EpisodeFile(gym.make(env_id))


def steps_taken(folder: str) -> tuple[float | None, int]:
    """The earliest first step of any process under ``folder`` (a ``time.time()``; None before any) and the steps
    of all of them, as last written."""
    first, steps = None, 0
    for path in glob.glob(os.path.join(folder, "*.steps")):
        try:
            with open(path) as f:
                parts = f.read().split()
        except FileNotFoundError:  # replaced while read
            continue
        if len(parts) == 3:
            first = float(parts[0]) if first is None else min(first, float(parts[0]))
            steps += int(parts[1])
    return first, steps


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
