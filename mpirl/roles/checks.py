"""Checks of a job that need no MPI: world size, environment, network, memory. Used by run, launch, validate."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from mpirl.config import ConfigError, JobConfig, check_world_size
from mpirl.envs.factory import env_spaces
from mpirl.roles import memory


class Checked(NamedTuple):
    """What the checks found: the env's spaces and each rank's memory estimate."""
    obs_shape: tuple
    obs_dtype: np.dtype
    n_actions: int
    memory: memory.Estimate


def check_job(cfg: JobConfig, world_size: int, job_path: str) -> Checked:
    """Everything that can be checked without messages.

    Memory: the biggest single rank must fit in this node's available memory (where the
    other ranks run is only known inside the job, which checks each node's sum).
    """
    check_world_size(cfg, world_size, job_path)
    check_out_dir(cfg)
    obs_shape, obs_dtype, n_actions = env_spaces(cfg.env)
    try:  # the estimate builds the job's network: a shape no network takes is refused here
        est = memory.estimate(cfg, world_size, obs_shape, obs_dtype, n_actions)
    except ValueError as err:
        raise ConfigError("env.id", str(err)) from None
    memory.check_fits(cfg, est, memory.LIBRARIES + max(est.learner, est.buffer, est.actor),
                      "one node (its largest rank alone)", memory.available_bytes())
    return Checked(obs_shape, obs_dtype, n_actions, est)


def check_out_dir(cfg: JobConfig) -> None:
    """``run.out_dir`` exists as a writable directory, or can be made (its nearest existing ancestor is one)."""
    path = Path(cfg.run.out_dir).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        raise ConfigError("run.out_dir", f"cannot make run directories under {cfg.run.out_dir!r}: {str(path)!r} "
                                         "is not a directory; choose another run.out_dir")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError("run.out_dir", f"cannot make run directories under {cfg.run.out_dir!r}: {str(path)!r} "
                                         "is not writable; choose another run.out_dir")


def check_local_job(cfg: JobConfig, world_size: int, job_path: str) -> Checked:
    """:func:`check_job` for a job whose ranks all run on this node (``mpirl launch``): their sum must fit,
    and a CUDA learner needs CUDA here."""
    checked = check_job(cfg, world_size, job_path)
    est = checked.memory
    memory.check_fits(cfg, est, est.total(), "this node (all ranks)", memory.available_bytes())
    if cfg.agent.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("agent.device", "'cuda' but this node has no usable CUDA device; "
                              "use 'auto' (CUDA when present) or 'cpu'")
    return checked
