"""An Atari game of the Arcade Learning Environment (``ALE/Pong-v5``, ``ALE/Breakout-v5``) as the reference
libraries' Atari runs start it, before each library's own Atari wrappers (RLlib's and Sample Factory's venvs).

Runs inside a reference venv (:mod:`mpirl.bench.reference_venv`), so it imports nothing of mpirl; it works with the
Gymnasium of either (1.2.2 for RLlib, 0.29 for Sample Factory). :func:`make` is Gymnasium's ``-v5`` id with the
settings the standard DQN/IMPALA preprocessing and mpirl's Atari envs have: one emulator frame a step
(``frameskip=1``: the libraries' wrappers skip 4 frames, the max over the last two), no sticky actions
(``repeat_action_probability=0``; ``-v5`` defaults to 0.25), the game's minimal action set, and ``-v5``'s cap of
108,000 frames a game. On it sits Gymnasium's ``RecordEpisodeStatistics``, beneath every library wrapper: at the
step where the whole game ends (not a life), its ``info["episode"]["r"]`` is the game's return, unclipped, which
:class:`episode_file.EpisodeFile` records above the wrappers (``games=True``). RLlib's runs play it; Sample
Factory's own ``make_atari_env`` makes the same game by its legacy id (:func:`legacy_id`) and puts its own
``RecordEpisodeStatistics`` there.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

PREFIX = "ALE/"
FRAMESKIP = 4  # emulator frames per agent step in the libraries' Atari wrappers (as in mpirl's Atari envs)


def is_ale(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def register() -> None:
    """Make Gymnasium know the ``ALE/...-v5`` and the legacy ``...NoFrameskip-v4`` ids. ale-py 0.12 registers them
    when imported, unless its vector env fails to import first, as under Gymnasium 0.29 (it needs 1.1's
    ``AutoresetMode``): then its registration functions are called here, which need nothing of Gymnasium 1.x."""
    import ale_py  # noqa: F401  (registers the ids where it can)
    if "ALE/Pong-v5" not in gym.envs.registry:
        from ale_py.registration import register_v0_v4_envs, register_v5_envs
        register_v0_v4_envs()
        register_v5_envs()


def legacy_id(env_id: str) -> str:
    """The ``NoFrameskip-v4`` id of the game of ``env_id`` (``ALE/Pong-v5``: ``PongNoFrameskip-v4``), which ale-py
    0.12 makes with :func:`make`'s settings: one frame a step, no sticky actions, the minimal action set, 108,000
    frames at most."""
    return env_id[len(PREFIX):].rsplit("-v", 1)[0] + "NoFrameskip-v4"


def make(env_id: str) -> gym.Env:
    """The raw game, one frame a step, no sticky actions, its whole-game returns in ``info["episode"]``."""
    register()
    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0, full_action_space=False)
    return gym.wrappers.RecordEpisodeStatistics(env)


def game_return(info: dict) -> float | None:
    """The whole game's unclipped return if ``info`` is that of the step where it ended, else None (the layout of
    ``RecordEpisodeStatistics``' record: a float in Gymnasium 1.x, a one-element array in 0.29)."""
    episode = info.get("episode") if isinstance(info, dict) else None
    if episode is None:
        return None
    return float(np.asarray(episode["r"]).reshape(-1)[0])
