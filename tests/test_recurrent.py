"""Recurrent policies (an LSTM core, ``agent.recurrent = "lstm"``) for the gradient family: the core's state carried
across steps and zeroed where an episode starts, stored at each rollout's start, and the loss's unroll from it
reproducing the log-probabilities the actor acted with; the partially observed CartPole; settings refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpirl import config
from mpirl.agents.a3c import A3cModel, Rollout
from mpirl.config import EnvConfig
from mpirl.envs.factory import policy_env_spaces
from mpirl.envs.vector import GymVector

from conftest import JOBS, run_cli


def _model(*sets: str):
    cfg, _ = config.load(JOBS / "a3c_cartpole.toml", ['agent.recurrent="lstm"', "agent.hidden=[32, 32]", *sets])
    shape, _, spec = policy_env_spaces(EnvConfig(id="CartPoleNoVelocity-v1"))
    return cfg, A3cModel(shape, spec, cfg.agent, cfg.a3c, torch.device("cpu"), seed=0, optimizer=True)


def _play(model, vec, obs, starts, rng, T: int):
    """One rollout as a worker plays it (mpirl.gradients.worker.Games.play, without MPI)."""
    ro = Rollout(T, vec.num_envs, (2,), np.float32, model.spec, state_size=32)
    model.begin(ro)
    for t in range(T):
        ro.first[t] = starts
        actions, logp, values = model.act(obs, rng, starts)
        step = vec.step(actions)
        ro.obs[t], ro.action[t], ro.logp[t], ro.value[t] = obs, actions, logp, values
        ro.reward[t], ro.terminated[t], ro.truncated[t] = step.reward, step.terminated, step.truncated
        starts = step.terminated | step.truncated
        obs = step.obs
    ro.steps = T
    return ro, obs, starts


def test_the_loss_unroll_reproduces_the_actors_log_probabilities_from_the_stored_state():
    """Two rollouts in a row of 4 games whose episodes (7 steps at most) end inside them: the second starts from
    the state the first left. Unrolled from each rollout's stored state with its episode starts, the network gives
    the log-probabilities and values the actor acted with; from a zero state instead it does not."""
    cfg, model = _model()
    vec = GymVector(EnvConfig(id="CartPoleNoVelocity-v1", max_episode_steps=7), 4, seed=0)
    rng = np.random.default_rng(0)
    try:
        obs, starts = vec.reset(), np.ones(4, bool)
        for rollout in range(2):
            ro, obs, starts = _play(model, vec, obs, starts, rng, 24)
            assert ro.first.sum() >= 8 and (rollout == 0) == bool(ro.first[0].all())
            p = model.prepare(ro)
            with torch.no_grad():
                out, values, _, _ = model.net.unroll(p.obs, p.h0, p.c0, p.first)
                logp, _ = model.net.log_prob_entropy(out.reshape(96, -1), p.action.reshape(96))
            assert np.allclose(logp.numpy().reshape(24, 4), ro.logp, atol=1e-5)
            assert np.allclose(values.numpy(), ro.value, atol=1e-5)
            if rollout == 1:
                assert np.abs(ro.h0).max() > 0.01  # carried, not zero
                with torch.no_grad():
                    cold, _, _, _ = model.net.unroll(p.obs, torch.zeros_like(p.h0), torch.zeros_like(p.c0), p.first)
                    logp0, _ = model.net.log_prob_entropy(cold.reshape(96, -1), p.action.reshape(96))
                assert not np.allclose(logp0.numpy().reshape(24, 4), ro.logp, atol=1e-4)
    finally:
        vec.close()


def test_a_recurrent_ppo_minibatch_is_whole_games_and_its_gradient_is_finite():
    cfg, model = _model('a3c.loss="ppo"', "a3c.epochs=2", "a3c.minibatches=2")
    vec = GymVector(EnvConfig(id="CartPoleNoVelocity-v1"), 4, seed=1)
    try:
        ro, _, _ = _play(model, vec, vec.reset(), np.ones(4, bool), np.random.default_rng(1), 16)
    finally:
        vec.close()
    p = model.prepare(ro)
    assert p.n == 4  # games, not steps
    grad = np.zeros(model.n_params, np.float32)
    stats = model.gradient(p, np.array([0, 2]), grad)
    assert stats is not None and np.isfinite(grad).all() and np.abs(grad).max() > 0


@pytest.mark.parametrize("job,sets,key", [
    ("a3c_cartpole.toml", ['agent.recurrent="lstm"', "agent.shared_torso=false"], "agent.shared_torso"),
    ("a3c_cartpole.toml", ['agent.recurrent="lstm"', 'a3c.loss="ppo"', "a3c.minibatches=16"], "a3c.minibatches"),
    ("cartpole.toml", ['agent.recurrent="lstm"'], "agent.recurrent"),  # Ape-X
    ("predator_prey_qmix.toml", ['agent.recurrent="lstm"'], "agent.recurrent"),  # QMIX (its GRU is its own)
    ("taxi_distql.toml", ['agent.recurrent="lstm"'], "agent.recurrent"),
])
def test_a_recurrent_setting_where_it_cannot_be_is_exit_2_naming_the_key(job, sets, key):
    proc = run_cli("validate", str(JOBS / job), *[x for s in sets for x in ("--set", s)])
    assert proc.returncode == 2 and key in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_partially_observed_cartpole_hides_the_velocities():
    from mpirl.envs.factory import make_env
    env = make_env(EnvConfig(id="CartPoleNoVelocity-v1"))
    try:
        obs, _ = env.reset(seed=3)
        full = env.unwrapped.state
        assert obs.shape == (2,) and np.allclose(obs, np.asarray(full)[[0, 2]])
    finally:
        env.close()
