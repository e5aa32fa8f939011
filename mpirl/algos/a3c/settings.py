"""The gradient family's settings: the ``[a3c]`` section, and the keys of the shared sections it reads.

Workers play their own games with their own copy of the actor-critic and send **gradients**; ``exchange`` says to
whom and how (the survey's synchronous vs asynchronous): ``"async"`` (A3C, Gorila's parameter server), ``"sync"``
(DPPO's leader, ``stragglers`` of them not waited for) or ``"allreduce"`` (DD-PPO: no server, straggler preemption
with ``sync_frac``). ``run.train_steps`` counts updates of the parameters (the server's, or every rank's under
``allreduce``); ``run.env_steps`` the workers' steps together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpirl.domain import ConfigError, Domain, setting
from mpirl.sections import check_recurrent, check_schedules

EXCHANGES = ("async", "sync", "allreduce")


@dataclass
class A3cConfig:
    # Worker ranks; 0: every rank after the server (async, sync) or every rank (allreduce).
    workers: int = setting(0, ge=0, le=1_000_000, why="0: every rank after the server (every rank: allreduce)")
    exchange: str = setting("async", choices=EXCHANGES)
    # "a2c": the n-step advantage actor-critic loss of the whole rollout, one gradient per rollout; "ppo": the
    # clipped surrogate (Schulman et al. 2017), `epochs` passes of `minibatches` gradients over each rollout.
    loss: str = setting("a2c", choices=("a2c", "ppo"))
    # Steps of each of a worker's games in one rollout (env.envs_per_actor games).
    unroll: int = setting(20, ge=1, le=100_000)
    epochs: int = setting(1, ge=1, le=1_000, why="passes over a rollout (ppo)")
    minibatches: int = setting(1, ge=1, le=100_000, why="gradients per pass (ppo)")
    clip: float = setting(0.2, gt=0, le=10, why="PPO's ratio clip")
    clip_final: float = setting(math.nan, gt=0, le=10, nan=True, why="nan: constant (the clip's schedule)")
    # Generalised advantage estimation's lambda; 1: the n-step return to the rollout's end (A2C).
    gae_lambda: float = setting(1.0, ge=0, le=1)
    normalize_advantages: bool = setting(True)
    value_coef: float = setting(0.5, ge=0, le=1e6)
    entropy_coef: float = setting(0.01, ge=0, le=1e6)
    # Linear from entropy_coef to entropy_final over agent.schedule_steps (nan: constant; mpirl.agents.schedules).
    entropy_final: float = setting(math.nan, ge=0, le=1e6, nan=True, why="nan: constant")
    # Each reward times reward_scale (after agent.reward_clip) in the loss; episode returns stay the environment's.
    reward_scale: float = setting(1.0, gt=0, le=1e6)
    optimizer: str = setting("adam", choices=("adam", "rmsprop"))
    rmsprop_alpha: float = setting(0.99, gt=0, lt=1)
    rmsprop_eps: float = setting(1e-5, gt=0, le=1)
    # async: a gradient computed on parameters more than max_staleness updates old is dropped (and counted).
    max_staleness: int = setting(32, ge=0, le=10**9, why="updates; 0: only gradients of the current parameters")
    # sync: each round the server waits for the gradients of workers - stragglers workers (DPPO's D); the rest of
    # the round's gradients, arriving after it closed, are dropped and counted.
    stragglers: int = setting(0, ge=0, le=1_000_000, why="DPPO's D: gradients a round does not wait for")
    # allreduce: a worker ends its rollout early once sync_frac of the workers have finished theirs and it has
    # played min_steps_frac of its unroll (DD-PPO: 0.6 and 0.25); sync_frac = 1: never preempted.
    sync_frac: float = setting(0.6, gt=0, le=1, why="DD-PPO's straggler threshold; 1: no preemption")
    min_steps_frac: float = setting(0.25, gt=0, le=1, why="the share of unroll a preempted rollout keeps at least")
    # allreduce: every check_every updates the ranks compare a hash of their parameters (0: never).
    check_every: int = setting(100, ge=0, le=10**9, why="updates between checks; 0: never")
    # Microseconds added to every env step of each worker: one value for all, or one per worker (a straggler).
    worker_delay_us: list = setting([0], items=Domain(ge=0, le=10**9), why="one for all, or one per worker")
    # At the stop the server (rank 0 under allreduce) plays test_episodes games with the final policy.
    test_episodes: int = setting(10, ge=0, le=100_000, why="0: no test round")

    @property
    def min_steps(self) -> int:
        """Steps of a rollout a preempted worker keeps at least (allreduce)."""
        return max(1, math.ceil(self.unroll * self.min_steps_frac))


SECTIONS = {"a3c": A3cConfig}

MOVED: dict[str, str] = {}

# Rewards divided by the spread of the discounted return: what keeps a policy-gradient step's size independent of
# the rewards' scale (LunarLander's crash of -100 took the unscaled policy to one action within seconds).
DEFAULTS: dict[str, object] = {"agent.normalize_reward": True}

USES = {
    "run": ("train_steps", "env_steps", "wall_seconds", "target_return", "return_window"),
    "checkpoint": ("every_seconds", "every_steps", "keep"),
    "agent": ("gamma", "lr", "adam_eps", "hidden", "network", "activation", "shared_torso", "log_std_init",
              "recurrent", "weight_init", "normalize_obs", "normalize_reward", "normalized_obs_clip",
              "normalized_reward_clip", "lr_final", "schedule_unit", "schedule_steps",
              "grad_clip", "reward_clip", "device", "torch_threads"),
    "env": ("id", "envs_per_actor", "max_episode_steps", "channels", "frameskip", "frame_stack", "noop_max",
            "repeat_action_probability", "env_threads", "terminal_on_life_loss", "fire_on_life_loss"),
}


def has_server(cfg) -> bool:
    return cfg.a3c.exchange != "allreduce"


def world_size(cfg) -> int:
    """The server (async, sync) and the workers (4 by default)."""
    return int(has_server(cfg)) + (cfg.a3c.workers or 4)


def updates_per_rollout(cfg) -> int:
    """Gradients a worker computes on one rollout."""
    a = cfg.a3c
    return a.epochs * a.minibatches if a.loss == "ppo" else 1


def min_steps(cfg) -> int:
    """Steps of a rollout a preempted worker keeps at least (allreduce)."""
    return cfg.a3c.min_steps


def check(cfg) -> None:
    """The cross-field checks that need no world size (those are in algorithm.py)."""
    r, a = cfg.run, cfg.a3c
    if not (r.train_steps or r.env_steps or r.wall_seconds):
        raise ConfigError("run", "set at least one stop condition: run.train_steps, run.env_steps or "
                                 "run.wall_seconds")
    if a.loss == "a2c" and (a.epochs != 1 or a.minibatches != 1):
        key = "a3c.epochs" if a.epochs != 1 else "a3c.minibatches"
        raise ConfigError(key, f"must be 1 with a3c.loss = \"a2c\" (one gradient of the whole rollout); set "
                               f"a3c.loss = \"ppo\" for passes of minibatches, got {getattr(a, key.split('.')[1])}")
    # The smallest rollout (a preempted one under allreduce) must give every minibatch a sample.
    smallest = cfg.env.envs_per_actor * (min_steps(cfg) if a.exchange == "allreduce" else a.unroll)
    if a.minibatches > smallest:
        where = (f"a preempted rollout keeps {min_steps(cfg)} step(s) of a3c.unroll = {a.unroll} "
                 f"(a3c.min_steps_frac = {a.min_steps_frac:g})" if a.exchange == "allreduce"
                 else f"a rollout is a3c.unroll = {a.unroll} step(s)")
        raise ConfigError("a3c.minibatches", f"must be at most the samples of the smallest rollout, "
                                             f"{smallest} ({where} x env.envs_per_actor = {cfg.env.envs_per_actor} "
                                             f"games), got {a.minibatches}")
    check_recurrent(cfg)
    if cfg.agent.recurrent != "none" and a.minibatches > cfg.env.envs_per_actor:
        raise ConfigError("a3c.minibatches", f"a recurrent policy's minibatches are whole games (unrolled from the "
                                             f"rollout's first state): at most env.envs_per_actor = "
                                             f"{cfg.env.envs_per_actor}, got {a.minibatches}")
    check_schedules(cfg, {"agent.lr_final": cfg.agent.lr_final, "a3c.entropy_final": a.entropy_final,
                          "a3c.clip_final": a.clip_final})
    if a.exchange != "sync" and a.stragglers:
        raise ConfigError("a3c.stragglers", f"is DPPO's leader setting and needs a3c.exchange = \"sync\" (it is "
                                            f"{a.exchange!r}); set it to 0")
