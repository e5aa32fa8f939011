"""Ape-X DQN behind the algorithm seam: its checks, roles, rank files and validate line.

Ranks: 0 the learner, then the buffers, then the actors (spread over the buffers; see
:mod:`mpirl.comm.topology`). Records: the n-step transition of :func:`mpirl.agents.dqn.transition_spec`.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from mpirl.algos.apex.builder import ApexBuilder
from mpirl.algos.apex import memory
from mpirl.job.contract import Checked, RoleLoop
from mpirl.config import ConfigError, JobConfig
from mpirl.replay_job import actor_count, check_world_size, learners
from mpirl.envs.factory import env_spaces
from mpirl.actor_learner.replay_layout import (build_topology, inference, layout, rank_files, role_map,  # noqa: F401
                                              roles)


class Spaces(NamedTuple):
    obs_shape: tuple
    obs_dtype: np.dtype
    n_actions: int


def multi_agent_id(env_id: str) -> bool:
    return env_id == "predator_prey" or env_id.split(".")[0] in ("pettingzoo", "mpe2")


def check(cfg: JobConfig, world_size: int, job_path: str) -> Checked:
    check_world_size(cfg, world_size, job_path)
    if multi_agent_id(cfg.env.id):
        raise ConfigError("env.id", f"{cfg.env.id!r} is a multi-agent (PettingZoo) environment and Ape-X plays "
                                    "single-agent Gymnasium ones; set agent.algorithm = \"qmix\"")
    obs_shape, obs_dtype, n_actions = env_spaces(cfg.env)
    from mpirl.agents.network_choice import network_for
    try:
        network_for(obs_shape, cfg.agent.network)
    except ValueError as err:  # a shape the chosen (or no) network takes
        key = "env.id" if cfg.agent.network == "auto" else "agent.network"
        raise ConfigError(key, f"{cfg.env.id!r} observes {obs_shape} {np.dtype(obs_dtype)}: {err}") from None
    try:  # the estimate builds the job's network (shapes only): a layer that refuses the shape is caught here
        est = memory.estimate(cfg, world_size, obs_shape, obs_dtype, n_actions)
    except RuntimeError as err:  # a layer refused the shape, e.g. a convolution wider than the image
        first = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError("env.id", f"{cfg.env.id!r} observes {obs_shape} {np.dtype(obs_dtype)} and the network "
                                    f"for that shape cannot take it ({first}); choose another environment") from None
    from mpirl.agents.dqn import transition_spec
    # The estimate counted the network's parameters in float32 bytes: that is the broadcast's length.
    return Checked(Spaces(obs_shape, np.dtype(obs_dtype), n_actions), transition_spec(obs_shape, obs_dtype),
                   est.network_bytes // 4, est)



ROLES: dict[str, RoleLoop] = roles(ApexBuilder())



def describe(cfg: JobConfig, world_size: int, checked: Checked) -> str:
    s, t = checked.spaces, cfg.topology
    workers = inference(t)
    return (f"{learners(t)}, {t.buffers} buffer(s){workers}, {actor_count(cfg, world_size)} actor(s); "
            f"{cfg.env.id} obs {s.obs_shape} {s.obs_dtype}, {s.n_actions} actions; "
            f"replay {cfg.replay.architecture}, batch {cfg.replay.batch_size}, capacity {cfg.replay.capacity}")



def summary(run_dir: Path) -> str:
    """The end-of-job summary (what ``mpirl info`` prints)."""
    from mpirl.algos.apex.info import format_summary, summarize
    return format_summary(summarize(run_dir))
