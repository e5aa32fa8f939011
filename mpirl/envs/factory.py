"""Environment factories: gymnasium ids -> environments, checked before the job starts.

MinAtar's ids (``MinAtar/Breakout-v1``, ...) are registered here on first use: the ``minatar``
package registers them through a Gymnasium plugin entry point that Gymnasium 1.x does not run.
"""

from __future__ import annotations

import difflib
import functools
import importlib

import gymnasium as gym
import numpy as np

from mpirl.config import ConfigError, EnvConfig
from mpirl.envs.actions import ActionSpec, action_spec, discrete
from mpirl.envs.atari import ale_spaces, is_ale_id
from mpirl.envs.images import channels_first_shape, channels_last

MINATAR_PREFIX = "MinAtar/"


def _register_minatar(env_id: str) -> None:
    """MinAtar's ids, registered by hand (its Gymnasium plugin entry point is not run by Gymnasium 1.x)."""
    if any(known.startswith(MINATAR_PREFIX) for known in gym.envs.registry):
        return  # registered already (an unknown game is refused with the rest)
    try:
        import minatar.gym
    except ImportError as err:
        raise ConfigError("env.id", f"{env_id!r} needs the minatar package ({err}); install it with "
                                    "pip install 'mpirl[minatar]'") from None
    minatar.gym.register_envs()


def _check_id(env_id: str) -> None:
    """Known ids pass; ``module:EnvId`` imports the module that registers the env first."""
    if ":" in env_id:
        module, env_id = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError("env.id", f"cannot import {module!r} to register {env_id!r}: {err}") from None
    if env_id.startswith(MINATAR_PREFIX):
        _register_minatar(env_id)
    from mpirl.envs import masked
    if env_id in masked.IDS:  # the project's partially observed tasks
        masked.register()
    if env_id in gym.envs.registry:
        return
    near = difflib.get_close_matches(env_id, list(gym.envs.registry), n=3)
    hint = f"; did you mean {', '.join(near)}?" if near else "; see gymnasium.envs.registry for the ids"
    raise ConfigError("env.id", f"unknown environment {env_id!r}{hint}")


@functools.lru_cache(maxsize=None)
def _mujoco_warnings_to_python(env_id: str) -> None:
    """MuJoCo's warnings (Gymnasium 1.4's models use attributes MuJoCo 4 deprecates) as Python warnings: by default
    MuJoCo appends each to a MUJOCO_LOG.TXT in the working directory, a file the user never asked for. The hook is
    the process's: set once per env id, not for every env an actor builds."""
    try:
        entry = str(gym.spec(env_id.split(":", 1)[-1]).entry_point)
    except Exception:  # noqa: BLE001 - an id gym cannot spec is refused by gym.make with its own message
        return
    if "mujoco" in entry:
        import warnings
        import mujoco
        mujoco.set_mju_user_warning(lambda message: warnings.warn(f"MuJoCo: {message.strip()}", stacklevel=1))


def make_env(cfg: EnvConfig, seed: int | None = None, render_mode: str | None = None) -> gym.Env:
    """One environment for an actor; ``seed`` seeds its first reset and action space; ``render_mode``: Gymnasium's
    (``"rgb_array"`` for a video of it)."""
    _check_id(cfg.id)
    _mujoco_warnings_to_python(cfg.id)
    kwargs: dict = {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        env = gym.make(cfg.id, **kwargs)
    except Exception as err:  # a registered env whose dependencies are missing, etc.
        raise ConfigError("env.id", f"cannot create {cfg.id!r}: {err}") from None
    if isinstance(env.observation_space, (gym.spaces.Dict, gym.spaces.Tuple)):
        env = gym.wrappers.FlattenObservation(env)  # one vector, in the space's order (Gymnasium's flatten)
    if seed is not None:
        env.action_space.seed(seed)
    return env


def _obs_spaces(env: gym.Env, cfg: EnvConfig) -> tuple[tuple[int, ...], np.dtype]:
    obs = env.observation_space
    if not isinstance(obs, gym.spaces.Box):
        raise ConfigError("env.id", f"{cfg.id!r} has observation space {obs}; mpirl needs a Box (Dict and Tuple "
                                    "ones are flattened)")
    shape = tuple(obs.shape)
    if channels_last(shape, cfg.channels):
        shape = channels_first_shape(shape)
    return shape, np.dtype(obs.dtype)


def spaces_of(env: gym.Env, cfg: EnvConfig) -> tuple[tuple[int, ...], np.dtype, int]:
    """(observation shape, observation dtype, number of actions) of a built env as the actor hands its
    observations on (images channels first: :mod:`mpirl.envs.images`), validated for DQN."""
    act = env.action_space
    if not isinstance(act, gym.spaces.Discrete):
        raise ConfigError("env.id", f"{cfg.id!r} has action space {act}; DQN needs a Discrete one")
    return (*_obs_spaces(env, cfg), int(act.n))


def policy_spaces_of(env: gym.Env, cfg: EnvConfig) -> tuple[tuple[int, ...], np.dtype, ActionSpec]:
    """(observation shape, observation dtype, :class:`~mpirl.envs.actions.ActionSpec`) of a built env, for the
    policies that sample their actions (IMPALA, the gradient family): Discrete, MultiDiscrete and Box actions."""
    return (*_obs_spaces(env, cfg), action_spec(env.action_space, cfg.id))


def env_spaces(cfg: EnvConfig) -> tuple[tuple[int, ...], np.dtype, int]:
    """(observation shape, observation dtype, number of actions); validates the env for DQN.

    ``"ALE/..."`` ids are Atari games, run as one vector (``mpirl.envs.vector.AtariVector``): ale-py answers.
    """
    if is_ale_id(cfg.id):
        return ale_spaces(cfg)
    env = make_env(cfg)
    try:
        return spaces_of(env, cfg)
    finally:
        env.close()


def policy_env_spaces(cfg: EnvConfig) -> tuple[tuple[int, ...], np.dtype, ActionSpec]:
    """:func:`policy_spaces_of` of the job's env id (Atari games: their minimal action set)."""
    if is_ale_id(cfg.id):
        shape, dtype, n = ale_spaces(cfg)
        return shape, dtype, discrete(n)
    env = make_env(cfg)
    try:
        return policy_spaces_of(env, cfg)
    finally:
        env.close()


def reference_observation(cfg: EnvConfig) -> np.ndarray:
    """The first observation of a game of the job's env seeded 0: the same on every rank without a message (the
    running statistics' shift, :mod:`mpirl.agents.running_stats`)."""
    env = make_env(cfg, seed=0)
    try:
        return np.asarray(env.reset(seed=0)[0], np.float64)
    finally:
        env.close()
