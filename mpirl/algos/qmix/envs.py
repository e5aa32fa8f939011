"""The job's multi-agent environment from its config: which PettingZoo env, with which settings, for how long."""

from __future__ import annotations

from mpirl.config import JobConfig

# Episode limits when env.max_episode_steps is 0: the environments' own.
DEFAULT_LIMIT = {"predator_prey": 200, "pettingzoo.sisl.pursuit_v5": 500, "mpe2.simple_spread_v3": 25}


def episode_limit(cfg: JobConfig) -> int:
    return cfg.env.max_episode_steps or DEFAULT_LIMIT.get(cfg.env.id, 200)


def env_kwargs(cfg: JobConfig) -> dict:
    """The keyword arguments :func:`mpirl.envs.pettingzoo.make_team_env` takes for the job's env."""
    limit = episode_limit(cfg)
    if cfg.env.id == "predator_prey":
        pp = cfg.env.predator_prey
        return {"grid": pp.grid, "n_predators": pp.predators, "n_prey": pp.prey or pp.predators,
                "punishment": pp.punishment, "capture_reward": pp.capture_reward, "max_steps": limit}
    return {"max_cycles": limit}


def make(cfg: JobConfig, seed: int):
    from mpirl.envs.pettingzoo import make_team_env
    return make_team_env(cfg.env.id, seed, **env_kwargs(cfg))
