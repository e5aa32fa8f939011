"""Schedules of the learning rate, the entropy coefficient and PPO's clip: their values at the endpoints and between,
where the run's progress comes from, the models taking them, and the horizons refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mpirl import config
from mpirl.agents.schedules import Linear, horizon, progress_of, scheduled

from conftest import JOBS, run_cli


def _job(*sets: str, job: str = "pendulum_ppo.toml"):
    cfg, _ = config.load(JOBS / job, list(sets))
    return cfg


def test_a_linear_schedule_at_its_endpoints_between_and_after():
    s = Linear(3e-4, 0.0, 1000)
    assert s(0) == 3e-4 and s(1000) == 0.0 and s(5000) == 0.0 and s(-5) == 3e-4
    assert s(250) == pytest.approx(2.25e-4)
    assert Linear(0.2, math.nan, 1000)(700) == 0.2  # nan: constant
    up = Linear(0.0, 0.01, 10)
    assert up(5) == pytest.approx(0.005) and up(10) == 0.01


def test_the_horizon_is_the_runs_limit_unless_set_and_progress_is_counted_in_its_unit():
    cfg = _job("agent.lr_final=0")
    assert horizon(cfg) == 1_000_000 and progress_of(cfg, 7, 5000) == 5000
    cfg = _job("agent.lr_final=0", 'agent.schedule_unit="train_steps"', "run.train_steps=300")
    assert horizon(cfg) == 300 and progress_of(cfg, 7, 5000) == 7
    cfg = _job("agent.lr_final=0", "agent.schedule_steps=400000")
    assert horizon(cfg) == 400_000 and scheduled(cfg, {"lr": (1e-3, 0.0)})["lr"](200_000) == pytest.approx(5e-4)


def test_the_models_take_their_scheduled_values():
    """The gradient family's model sets its optimizer's learning rate, the loss's entropy coefficient and PPO's clip;
    IMPALA's learner its learning rate and entropy coefficient."""
    from mpirl.agents.a3c import A3cModel
    from mpirl.agents.actor_critic import ImpalaLearner
    from mpirl.envs.actions import discrete
    cfg = _job("agent.lr_final=0", "a3c.entropy_final=0.1", "a3c.clip_final=0.1", "a3c.entropy_coef=0.0")
    sched = scheduled(cfg, {"lr": (cfg.agent.lr, cfg.agent.lr_final), "entropy_coef": (0.0, 0.1),
                            "clip": (cfg.a3c.clip, cfg.a3c.clip_final)})
    model = A3cModel((3,), discrete(2), cfg.agent, cfg.a3c, torch.device("cpu"), 0, True, schedules=sched)
    model.at(0)
    assert model.optimizer.param_groups[0]["lr"] == 1e-3 and model.entropy_coef == 0.0 and model.clip == 0.2
    model.at(500_000)
    assert model.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)
    assert model.entropy_coef == pytest.approx(0.05) and model.clip == pytest.approx(0.15)
    model.at(2_000_000)
    assert model.optimizer.param_groups[0]["lr"] == 0.0 and model.entropy_coef == 0.1 and model.clip == 0.1
    icfg = _job("agent.lr_final=0", "impala.entropy_final=0", job="impala_pendulum.toml")
    learner = ImpalaLearner((3,), discrete(2), icfg.agent, icfg.impala, torch.device("cpu"),
                            schedules=scheduled(icfg, {"lr": (1e-3, 0.0), "entropy_coef": (0.01, 0.0)}))
    learner.at(icfg.run.env_steps / 2)
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4) and learner.entropy_coef == 0.005
    assert np.isfinite(learner.entropy_coef)


@pytest.mark.parametrize("sets,says", [
    (["agent.lr_final=0", "agent.schedule_steps=2000000"], "after the run's end"),
    (["a3c.clip_final=0.1", "run.env_steps=0"], "sets no run.env_steps"),
    (["a3c.entropy_final=0", 'agent.schedule_unit="train_steps"'], "sets no run.train_steps"),
])
def test_a_schedule_without_a_horizon_or_ending_after_it_is_exit_2_naming_the_key(sets, says):
    proc = run_cli("validate", str(JOBS / "pendulum_ppo.toml"), *[x for s in sets for x in ("--set", s)])
    assert proc.returncode == 2 and "agent.schedule_steps" in proc.stderr and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("job,key", [("cartpole.toml", "agent.lr_final=0"),  # Ape-X
                                     ("taxi_distql.toml", "agent.normalize_obs=true"),  # DistQL
                                     ("taxi_distql.toml", "agent.normalize_reward=true"),
                                     ("predator_prey_qmix.toml", "agent.log_std_init=-1"),  # QMIX
                                     ("cartpole.toml", 'agent.activation="tanh"'),
                                     ("predator_prey_qmix.toml", 'agent.weight_init="orthogonal"')])
def test_an_actor_critic_setting_for_an_algorithm_that_does_not_take_it_is_exit_2_naming_it(job, key):
    proc = run_cli("validate", str(JOBS / job), "--set", key)
    name = key.split("=")[0]
    assert proc.returncode == 2 and name in proc.stderr and "does not use it" in proc.stderr, proc.stderr


def test_a_collapsed_categorical_policy_is_flagged_and_a_gaussian_one_never():
    from mpirl.agents.sampling import uniform_entropy
    from mpirl.envs.actions import action_spec, discrete
    from mpirl.metrics.formatting import collapse_note
    import gymnasium as gym
    assert uniform_entropy(discrete(4)) == pytest.approx(math.log(4))
    assert uniform_entropy(action_spec(gym.spaces.MultiDiscrete([3, 4]), "x")) == pytest.approx(math.log(12))
    assert math.isnan(uniform_entropy(action_spec(gym.spaces.Box(-1, 1, (2,)), "x")))
    note = collapse_note(3e-4, math.log(4), "raise a3c.entropy_coef")
    assert "0.0003" in note and "5%" in note and "raise a3c.entropy_coef" in note
    assert collapse_note(0.1, math.log(2), "x") == ""  # a CartPole policy near its end still explores this much
    assert collapse_note(0.026, math.log(2), "x") != ""  # one action 99.6 % of the time (CartPole's returns: ~9)
    assert collapse_note(-5.0, math.nan, "x") == "" and collapse_note(math.nan, 1.0, "x") == ""


@pytest.mark.mpi
def test_mpirl_info_flags_a_policy_whose_entropy_collapsed(tmp_path):
    """A CartPole A2C run of 2 workers with a learning rate 300 times the job's and no entropy bonus locks onto one
    action within 100 updates (allreduce without preemption: the same run however loaded the machine; twice here:
    entropy 2.5e-07, returns 9.5; 4.6 CPU-s, where 4 workers at 100 times the job's rate took 300 updates and 13.7):
    `mpirl info` says so and what to try."""
    from conftest import run_mpi
    job = run_mpi(2, tmp_path, "run.train_steps=100", "run.target_return=nan", "run.wall_seconds=0",
                  'a3c.exchange="allreduce"', "a3c.sync_frac=1.0", "agent.lr=0.3", "a3c.entropy_coef=0.0",
                  "a3c.test_episodes=0", job=JOBS / "a3c_cartpole.toml", timeout=600)
    assert job.proc.returncode == 0, job.output
    proc = run_cli("info", str(job.run_dir))
    assert proc.returncode == 0 and "under 5% of a uniform policy's 0.693" in proc.stdout, proc.stdout
    assert "raise a3c.entropy_coef" in proc.stdout
