"""The job's multi-agent environment from its config: which PettingZoo env, with which settings, for how long.

How long: ``env.max_episode_steps``, or when it is 0 the env's own limit, read off the env
(:func:`mpirl.envs.pettingzoo.own_episode_limit`: PettingZoo's ``max_cycles``, predator_prey's ``max_steps``).
An env that keeps no limit needs the setting: QMIX's replay records whole episodes of a known length.
A set limit is passed to the env by the keyword it keeps its own under (so it truncates there itself); an env
without one is cut at the limit by the actors.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mpirl.config import ConfigError, JobConfig


class Limit(NamedTuple):
    steps: int  # the longest episode
    keyword: str | None  # the env constructor's keyword for it (None: the actors cut episodes there)


def env_kwargs(cfg: JobConfig, limit: Limit | None = None) -> dict:
    """The keyword arguments :func:`mpirl.envs.pettingzoo.make_team_env` takes for the job's env; with ``limit``,
    the episode limit too when the env takes one."""
    kwargs: dict = {}
    if cfg.env.id == "predator_prey":
        pp = cfg.env.predator_prey
        kwargs = {"grid": pp.grid, "n_predators": pp.predators, "n_prey": pp.prey or pp.predators,
                  "punishment": pp.punishment, "capture_reward": pp.capture_reward}
    if limit is not None and limit.keyword:
        kwargs[limit.keyword] = limit.steps
    return kwargs


def episode_limit(cfg: JobConfig, team) -> Limit:
    """The job's episode limit for ``team`` (a TeamEnv built with :func:`env_kwargs` and no limit), or a
    ConfigError asking for env.max_episode_steps when the env keeps none."""
    from mpirl.envs.pettingzoo import own_episode_limit
    own = own_episode_limit(team)
    if cfg.env.max_episode_steps:
        return Limit(cfg.env.max_episode_steps, own[0] if own else None)
    if own is None:
        raise ConfigError("env.max_episode_steps", f"0 keeps the environment's own limit, and {cfg.env.id!r} keeps "
                                                   "none that can be read (no max_cycles); set the longest episode, "
                                                   "e.g. env.max_episode_steps = 200")
    return Limit(own[1], own[0])


def make(cfg: JobConfig, seed: int, spaces):
    """One game of the job's env; ``spaces``: what the job's check found (its episode limit and keyword)."""
    from mpirl.envs.pettingzoo import make_team_env
    return make_team_env(cfg.env.id, seed, **env_kwargs(cfg, Limit(spaces.episode_limit, spaces.limit_keyword)))


class Spaces(NamedTuple):
    n_agents: int
    obs_shape: tuple
    obs_dtype: np.dtype
    state_shape: tuple
    state_dtype: np.dtype
    n_actions: int
    episode_limit: int
    limit_keyword: str | None = None  # the env's keyword for it (None: the actors cut episodes at the limit)


def spaces_of(cfg: JobConfig) -> Spaces:
    """The env's spaces, or a ConfigError naming env.id and why QMIX cannot use it."""
    from mpirl.envs import pettingzoo as pz
    from mpirl.envs.marl_install import MarlDependencyError, missing_package
    try:
        env = pz.make_team_env(cfg.env.id, 0, **env_kwargs(cfg))
    except MarlDependencyError as err:  # its message names the install that provides the package
        raise ConfigError("env.id", str(err)) from None
    except ModuleNotFoundError as err:
        raise ConfigError("env.id", str(missing_package(cfg.env.id, err.name or "?"))) from None
    except (ValueError, TypeError) as err:
        raise ConfigError("env.id", f"{cfg.env.id!r}: {err}") from None
    try:
        limit = episode_limit(cfg, env)
        return Spaces(env.n_agents, tuple(env.obs_shape), np.dtype(env.obs_dtype), tuple(env.state_shape),
                      np.dtype(env.state_dtype), int(env.n_actions), limit.steps, limit.keyword)
    finally:
        env.close()
