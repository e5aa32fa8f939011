"""Checks shared by the actor-critic algorithms (IMPALA, the gradient family): a single-agent environment whose
actions a policy here samples (Discrete, MultiDiscrete, Box: :mod:`mpirl.envs.actions`), and an actor-critic
network that can take its observations. No MPI; torch only on its meta device, to count parameters."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mpirl.config import ConfigError, JobConfig
from mpirl.envs.actions import ActionSpec
from mpirl.envs.factory import policy_env_spaces


class Spaces(NamedTuple):
    obs_shape: tuple
    obs_dtype: np.dtype
    action: ActionSpec


def actor_critic_spaces(cfg: JobConfig, name: str, teams: str) -> Spaces:
    """The env's spaces, or a ConfigError naming ``env.id`` when ``name`` (the algorithm) cannot play it;
    ``teams``: the fix for a multi-agent environment."""
    if cfg.env.id == "predator_prey" or cfg.env.id.split(".")[0] in ("pettingzoo", "mpe2"):
        raise ConfigError("env.id", f"{cfg.env.id!r} is a multi-agent (PettingZoo) environment and {name} plays "
                                    f"single-agent Gymnasium ones; {teams}")
    obs_shape, obs_dtype, action = policy_env_spaces(cfg.env)
    return Spaces(tuple(obs_shape), np.dtype(obs_dtype), action)


def actor_critic_params(spaces: Spaces, cfg: JobConfig) -> int:
    """The actor-critic's parameters, counted on torch's meta device (a ConfigError for a shape it cannot take)."""
    from mpirl.agents.actor_critic import actor_critic
    from mpirl.agents.network_choice import network_for
    from mpirl.agents.networks import parameter_count, shapes_only
    try:
        network_for(spaces.obs_shape, cfg.agent.network)
    except ValueError as err:
        key = "env.id" if cfg.agent.network == "auto" else "agent.network"
        raise ConfigError(key, f"{cfg.env.id!r} observes {spaces.obs_shape} {spaces.obs_dtype}: {err}") from None
    try:
        return parameter_count(shapes_only(lambda: actor_critic(spaces.obs_shape, spaces.action, cfg.agent)))
    except RuntimeError as err:  # a layer refused the shape
        first = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError("env.id", f"{cfg.env.id!r} observes {spaces.obs_shape} {spaces.obs_dtype} and the network "
                                    f"for that shape cannot take it ({first}); choose another environment") from None


def normalization_values(spaces: Spaces, cfg: JobConfig) -> int:
    """Values the job's running statistics add to the parameters (``agent.normalize_obs``, ``normalize_reward``), or
    a ConfigError for observations they cannot normalise: float vectors and ``uint8`` images (scaled by 1/255, then
    pixel by pixel: :mod:`mpirl.agents.running_stats`) are; integer and ``bool`` ones are not."""
    a = cfg.agent
    dtype = np.dtype(spaces.obs_dtype)
    if a.normalize_obs and not (np.issubdtype(dtype, np.floating) or dtype == np.uint8):
        raise ConfigError("agent.normalize_obs", f"{cfg.env.id!r} observes {spaces.obs_shape} {spaces.obs_dtype}: "
                                                 "only float observations and uint8 images are normalised; set "
                                                 "agent.normalize_obs = false")
    size = int(np.prod(spaces.obs_shape))
    return (1 + 2 * size if a.normalize_obs else 0) + (3 if a.normalize_reward else 0)
