"""Checks of a job that need no MPI: world size, environment, network. Used by run, launch, validate."""

from __future__ import annotations

import numpy as np

from mpirl.agents.networks import build_network
from mpirl.config import ConfigError, JobConfig, check_world_size
from mpirl.envs.factory import env_spaces


def check_job(cfg: JobConfig, world_size: int, job_path: str) -> tuple[tuple, np.dtype, int]:
    """Everything that can be checked without messages; returns the env's spaces."""
    check_world_size(cfg, world_size, job_path)
    obs_shape, obs_dtype, n_actions = env_spaces(cfg.env)
    try:
        build_network(obs_shape, n_actions, cfg.agent.hidden)
    except ValueError as err:
        raise ConfigError("env.id", str(err)) from None
    return obs_shape, obs_dtype, n_actions
