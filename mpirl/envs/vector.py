"""Vector environments for actors: k environments stepped together, same-step autoreset.

An actor owns one vector of ``k = env.envs_per_actor`` environments and steps it with
one action per environment. Two implementations share the interface:

* :class:`GymVector` -- k plain gymnasium envs (from :func:`mpirl.envs.factory.make_env`)
  stepped one after the other in this process;
* :class:`AtariVector` -- ``ale_py``'s C++ ``AtariVectorEnv``: Atari preprocessing
  (frame skip with max-pooling, 84x84 grayscale, frame stack, no-op starts, FIRE on
  reset) done natively, optionally on several threads.

"Same-step autoreset": when an episode ends, ``step`` resets that environment at once.
:class:`StepResult` carries both the last observation of the finished episode
(``final_obs``, for the n-step target) and the reset observation (``obs``, to act on).

Freshness contract: every array in a :class:`StepResult` (and the array returned by
``reset``) is newly allocated and is never written by the vector afterwards, so callers
may keep references (e.g. rows held in n-step windows) across later steps without
copying. When no episode ended, ``final_obs`` may be the very same array as ``obs``;
treat returned arrays as read-only.

Environment ids starting with ``"ALE/"`` (``"ALE/Breakout-v5"``) go to
:class:`AtariVector`; everything else to :class:`GymVector`.
"""

from __future__ import annotations

import difflib
import re
from typing import NamedTuple

import numpy as np

from mpirl.config import ConfigError, EnvConfig
from mpirl.envs.factory import env_spaces, make_env, spaces_of
from mpirl.envs.images import channels_last, to_channels_first

ALE_PREFIX = "ALE/"
_ALE_ID = re.compile(r"^ALE/(?P<name>[A-Za-z0-9_]+)(?P<ram>-ram)?(?:-v\d+)?$")


class StepResult(NamedTuple):
    """One step of k environments (arrays are fresh; see the module docstring).

    obs:        (k, *obs_shape) obs_dtype -- what to act on next; for an env whose
                episode ended this step it is already the reset observation.
    reward:     (k,) float32 -- the environment's raw, unclipped reward.
    terminated: (k,) bool -- the episode reached a terminal state (bootstrap with 0).
    truncated:  (k,) bool -- the episode was cut by a time limit (bootstrap from final_obs).
    final_obs:  (k, *obs_shape) obs_dtype -- for envs with terminated | truncated, the
                last observation of the finished episode; for the others equal to ``obs``.
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    # (k,) bool or None: a life was lost this step but the game goes on (Atari). Learners
    # that treat it as terminal cut the bootstrap there; episode statistics are unaffected.
    life_lost: np.ndarray | None = None


def env_seeds(seed: int, k: int) -> np.ndarray:
    """(k,) int64 seeds in [0, 2**31) derived from ``seed`` (ALE takes int32 seeds).

    Derived with ``SeedSequence`` rather than ``seed + i`` so that actors with nearby
    seeds do not share environment seeds.
    """
    return np.random.SeedSequence(seed).generate_state(k, dtype=np.uint32).astype(np.int64) % 2**31


class GymVector:
    """k gymnasium environments stepped in sequence in this process.

    Attributes: ``num_envs`` (k), ``obs_shape`` (tuple), ``obs_dtype`` (np.dtype),
    ``n_actions`` (int; the action space must be Discrete). Image observations come out channels
    first (:mod:`mpirl.envs.images`).
    """

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int = 0):
        self.seed = seed
        seeds = env_seeds(seed, num_envs)
        self.envs = [make_env(cfg, seed=int(s)) for s in seeds]
        self.num_envs = num_envs
        self.obs_shape, self.obs_dtype, self.n_actions = spaces_of(self.envs[0], cfg)
        self.move_channels = channels_last(self.envs[0].observation_space.shape, cfg.channels)

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset all envs (env i with a seed derived from ``seed``, default: the
        construction seed); returns obs (k, *obs_shape) obs_dtype."""
        seeds = env_seeds(self.seed if seed is None else seed, self.num_envs)
        return self._stack([env.reset(seed=int(s))[0] for env, s in zip(self.envs, seeds)])

    def step(self, actions: np.ndarray) -> StepResult:
        """Step env i with ``actions[i]`` ((k,) integer array); reset the envs that ended."""
        k = self.num_envs
        reward = np.zeros(k, np.float32)
        terminated, truncated = np.zeros(k, bool), np.zeros(k, bool)
        last, resets = [], {}
        for i, env in enumerate(self.envs):
            o, reward[i], terminated[i], truncated[i], _ = env.step(int(actions[i]))
            last.append(o)
            if terminated[i] or truncated[i]:
                resets[i] = env.reset()[0]
        final_obs = self._stack(last)  # np.stack copies: safe even if an env reuses its buffer
        obs = final_obs
        if resets:
            obs = self._stack([resets.get(i, o) for i, o in enumerate(last)])
        return StepResult(obs, reward, terminated, truncated, final_obs)

    def forced(self, actions: np.ndarray) -> np.ndarray:
        """The actions to execute: as chosen (see :meth:`AtariVector.forced`)."""
        return actions

    def _stack(self, rows: list) -> np.ndarray:
        batch = np.stack(rows).astype(self.obs_dtype, copy=False)
        return to_channels_first(batch) if self.move_channels else batch

    def close(self) -> None:
        for env in self.envs:
            env.close()


# --------------------------------------------------------------------------- Atari


def is_ale_id(env_id: str) -> bool:
    return env_id.startswith(ALE_PREFIX)


def _import_ale():
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
    _import_ale()
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


class AtariVector:
    """k Atari games in ale-py's native vector env (``autoreset_mode="SameStep"``).

    Observations (k, frame_stack, 84, 84) uint8; ``n_actions`` is the game's minimal
    action set (Breakout: 4). Attributes as :class:`GymVector`.
    """

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int = 0):
        vector_env = _import_ale()
        self.seed = seed
        self.game = ale_game(cfg.id)
        opts = atari_options(cfg)
        self._env = vector_env(self.game, num_envs=num_envs, autoreset_mode="SameStep", **opts)
        self.num_envs = num_envs
        self.obs_shape = tuple(self._env.single_observation_space.shape)
        self.obs_dtype = np.dtype(np.uint8)
        self.n_actions = int(self._env.single_action_space.n)
        self.life_loss_terminal = cfg.terminal_on_life_loss
        minimal = list(self._env.ale.get_action_set())
        fire = [i for i, a in enumerate(minimal) if getattr(a, "name", str(a)).endswith("FIRE")]
        # After a lost life the ball (Breakout) waits for FIRE: press it, as the reset does.
        self.fire = fire[0] if fire and cfg.fire_on_life_loss else None
        self.lives = None
        self.fire_next = np.zeros(num_envs, dtype=bool)

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset all games (seeds derived from ``seed``, default: the construction seed);
        returns obs (k, frame_stack, 84, 84) uint8 (older frames of the stack are zeros)."""
        obs, info = self._env.reset(seed=env_seeds(self.seed if seed is None else seed, self.num_envs))
        self.lives = np.asarray(info["lives"]).copy()
        self.fire_next[:] = False
        return obs

    def forced(self, actions: np.ndarray) -> np.ndarray:
        """The actions to execute (and record): FIRE for games that just lost a life."""
        if self.fire is None or not self.fire_next.any():
            return actions
        actions = np.array(actions, copy=True)
        actions[self.fire_next] = self.fire
        return actions

    def step(self, actions: np.ndarray) -> StepResult:
        """Step game i with ``actions[i]`` ((k,) integer array in [0, n_actions)).

        ale-py returns fresh arrays each step (checked in tests/test_envs.py). On steps
        where some game ended, ``info["final_obs"]`` holds the finished episodes' last
        observations in those rows and zeros in the others; we fill the others from obs.
        """
        obs, reward, terminated, truncated, info = self._env.step(np.asarray(actions, dtype=np.int64))
        ended = terminated | truncated
        final_obs = obs
        if ended.any():
            final_obs = info["final_obs"]
            final_obs[~ended] = obs[~ended]
        lives = np.asarray(info["lives"])
        life_lost = (lives < self.lives) & ~ended
        self.lives = lives.copy()
        self.fire_next = life_lost
        return StepResult(obs, reward.astype(np.float32), terminated, truncated, final_obs,
                          life_lost if self.life_loss_terminal else None)

    def close(self) -> None:
        self._env.close()


# --------------------------------------------------------------------------- entry points


def stacks_shift(cfg: EnvConfig) -> bool:
    """Whether a step's observation is the last one shifted by one frame plus the new frame (ale-py's frame
    stack), so a sender of frames once sends one frame a step (:mod:`mpirl.replay.frame_stream`)."""
    return is_ale_id(cfg.id)


def make_vector(cfg: EnvConfig, seed: int) -> GymVector | AtariVector:
    """The actor's ``cfg.envs_per_actor`` environments; ``seed`` is the default reset seed
    (GymVector also seeds each env's action space from it)."""
    cls = AtariVector if is_ale_id(cfg.id) else GymVector
    return cls(cfg, cfg.envs_per_actor, seed)


def vector_spaces(cfg: EnvConfig) -> tuple[tuple[int, ...], np.dtype, int]:
    """(obs shape, obs dtype, n_actions) of one environment, validated for DQN.

    For ALE ids this builds a 1-game ``AtariVectorEnv`` to read the minimal action set
    (about 0.1 s here; no reset is run).
    """
    if not is_ale_id(cfg.id):
        return env_spaces(cfg)
    vector_env, game, opts = _import_ale(), ale_game(cfg.id), atari_options(cfg)
    env = vector_env(game, num_envs=1, autoreset_mode="SameStep", **{**opts, "num_threads": 1})
    try:
        return tuple(env.single_observation_space.shape), np.dtype(np.uint8), int(env.single_action_space.n)
    finally:
        env.close()
