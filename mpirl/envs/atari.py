"""Atari ids (``"ALE/Breakout-v5"``): the game a name means, the emulator settings [env] gives, and the spaces of
one game, from ale-py (the vector of games itself: :class:`mpirl.envs.vector.AtariVector`)."""

from __future__ import annotations

import difflib
import re

import numpy as np

from mpirl.config import ConfigError, EnvConfig

ALE_PREFIX = "ALE/"
_ALE_ID = re.compile(r"^ALE/(?P<name>[A-Za-z0-9_]+)(?P<ram>-ram)?(?:-v\d+)?$")


def is_ale_id(env_id: str) -> bool:
    return env_id.startswith(ALE_PREFIX)


def import_ale():
    """``ale_py.vector_env.AtariVectorEnv``, or a ConfigError saying how to install it."""
    try:
        from ale_py.vector_env import AtariVectorEnv
    except ImportError as err:
        raise ConfigError("env.id", f"Atari ids need ale-py ({err}); pip install 'mpirl[atari]'") from None
    return AtariVectorEnv


def _pascal(rom: str) -> str:
    """ROM id -> the name gymnasium ids use: ``space_invaders`` -> ``SpaceInvaders``."""
    return rom.title().replace("_", "")


def ale_game(env_id: str) -> str:
    """``"ALE/SpaceInvaders-v5"`` -> ROM id ``"space_invaders"`` (raises ConfigError("env.id")).

    The name is matched against ale-py's ROM list ignoring case and underscores, so
    ``SpaceInvaders``, ``space_invaders`` and ``TicTacToe3D`` all resolve. The ``-vN``
    suffix is accepted and ignored: the emulator settings come from [env] (see
    :func:`atari_options`), not from the version.
    """
    import_ale()
    from ale_py import roms

    m = _ALE_ID.match(env_id)
    if m is None:
        raise ConfigError("env.id", f"cannot read {env_id!r}; Atari ids look like 'ALE/Breakout-v5'")
    if m["ram"]:
        raise ConfigError("env.id", f"{env_id!r}: RAM observations are not supported; use 'ALE/{m['name']}-v5'")
    rom_ids = roms.get_all_rom_ids()
    by_key = {rom.replace("_", ""): rom for rom in rom_ids}
    game = by_key.get(m["name"].replace("_", "").lower())
    if game is None:
        names = [_pascal(rom) for rom in rom_ids]
        near = difflib.get_close_matches(_pascal(m["name"]) if "_" in m["name"] else m["name"], names, n=4, cutoff=0.5)
        hint = (f"; did you mean {', '.join(f'ALE/{n}-v5' for n in near)}?" if near
                else f"; ale-py has {len(names)} games, e.g. ALE/Breakout-v5, ALE/Pong-v5")
        raise ConfigError("env.id", f"unknown Atari game {m['name']!r} in {env_id!r}{hint}")
    return game


def atari_options(cfg: EnvConfig) -> dict:
    """``AtariVectorEnv`` keyword arguments from [env] (fields read with defaults).

    Defaults are the DQN/Ape-X ("v4-style") settings: frame skip 4 with max-pool over the
    last two frames, 4 stacked 84x84 grayscale frames, up to 30 no-ops at reset, FIRE at
    reset, no sticky actions (gymnasium's ``-v5`` ids default to 0.25), a life loss does
    not end the episode, rewards unclipped (actors clip with ``agent.reward_clip``), episodes cut
    at 108,000 frames (27,000 steps) unless ``max_episode_steps`` is set.
    """
    frameskip, stack, noop_max = cfg.frameskip, cfg.frame_stack, cfg.noop_max
    sticky, threads = cfg.repeat_action_probability, cfg.env_threads
    for key, value, low in (("frameskip", frameskip, 1), ("frame_stack", stack, 1), ("noop_max", noop_max, 0),
                            ("env_threads", threads, 0)):
        if value < low:
            raise ConfigError(f"env.{key}", f"must be >= {low}, got {value}")
    if not 0.0 <= sticky <= 1.0:
        raise ConfigError("env.repeat_action_probability", f"must be in [0, 1], got {sticky}")
    max_steps = cfg.max_episode_steps
    return dict(frameskip=frameskip, stack_num=stack, noop_max=noop_max, repeat_action_probability=sticky,
                num_threads=threads, max_num_frames_per_episode=max_steps * frameskip if max_steps else 108_000,
                img_height=84, img_width=84, grayscale=True, maxpool=True, use_fire_reset=True,
                episodic_life=False, reward_clipping=False)


def ale_spaces(cfg: EnvConfig) -> tuple[tuple[int, ...], np.dtype, int]:
    """(obs shape, obs dtype, n_actions) of one Atari game: builds a 1-game ``AtariVectorEnv`` to read the minimal
    action set (about 0.1 s here; no reset is run)."""
    vector_env, game, opts = import_ale(), ale_game(cfg.id), atari_options(cfg)
    env = vector_env(game, num_envs=1, autoreset_mode="SameStep", **{**opts, "num_threads": 1})
    try:
        return tuple(env.single_observation_space.shape), np.dtype(np.uint8), int(env.single_action_space.n)
    finally:
        env.close()
