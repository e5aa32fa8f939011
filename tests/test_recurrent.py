"""Recurrent policies (an LSTM core, ``agent.recurrent = "lstm"``) for IMPALA and the gradient family: the core's
state carried across steps and zeroed where an episode starts, stored at each rollout's (trajectory's) start, and
the learner's unroll from it reproducing the log-probabilities the actor acted with; the partially observed
CartPole; an LSTM IMPALA job behind an inference worker; settings refused."""

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
    ("impala_cartpole.toml", ['agent.recurrent="lstm"', "agent.shared_torso=false"], "agent.shared_torso"),
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


def _impala(*sets: str):
    from mpirl.agents.policy_checks import actor_critic_spaces
    cfg, _ = config.load(JOBS / "impala_cartpole.toml", ['agent.recurrent="lstm"', "agent.hidden=[32, 32]",
                                                         'env.id="CartPoleNoVelocity-v1"', "env.max_episode_steps=7",
                                                         "env.envs_per_actor=3", "impala.unroll=8", *sets])
    return cfg, actor_critic_spaces(cfg, "IMPALA", "")


def test_impala_learners_unroll_reproduces_the_actors_log_probabilities_from_each_trajectorys_stored_state():
    """An actor's decisions record three trajectories in a row for each of 3 games whose episodes (7 steps at most)
    end inside them. The learner's network with the same parameters, unrolled from each trajectory's stored state
    with its episode starts, gives the log-probabilities the actor acted with; from a zero state it does not. The
    learner's train step on them is finite."""
    from mpirl.agents.actor_critic import ImpalaLearner, impala_losses, trajectory_spec
    from mpirl.algos.impala.serving import ImpalaDeciding, with_version
    from mpirl.envs.games import VectorGames
    cfg, spaces = _impala()
    spec = trajectory_spec(spaces.obs_shape, spaces.obs_dtype, 8, spaces.action, state_size=32)
    d = ImpalaDeciding(cfg, spaces, spec, [1])
    learner = ImpalaLearner(spaces.obs_shape, spaces.action, cfg.agent, cfg.impala, torch.device("cpu"), seed=0)
    flat = with_version(learner.flat_params(), 0)
    d.policy.load_flat(flat)
    games = VectorGames(cfg, spaces, 5, "test")
    taken = []
    try:
        outcome = games.start()
        d.observe(0, outcome)
        for _ in range(3):
            for _ in range(8):
                outcome = games.step(d.decide([0], [outcome]))
                d.observe(0, outcome)
            taken.append({k: v.copy() for k, v in d.take(3)[0].items()})  # views of the staging ring
            d.drop(3)
    finally:
        games.close()
    rec = {k: np.concatenate([t[k] for t in taken]) for k in taken[0]}
    ended = rec["terminated"] | rec["truncated"]
    assert ended.sum() >= 6 and np.array_equal(rec["first"][:, 1:], ended)
    assert rec["first"][:3, 0].all() and np.array_equal(rec["first"][3:, 0], rec["first"][:6, -1])
    assert np.abs(rec["h0"][3:]).max() > 0.01 and not rec["h0"][:3].any()  # carried from the last, zero at first
    b = {k: torch.as_tensor(v) for k, v in rec.items()}
    net = learner.net
    with torch.no_grad():
        out, values, _, _ = net.unroll(b["obs"].transpose(0, 1), b["h0"], b["c0"], b["first"].transpose(0, 1))
        logp, _ = net.log_prob_entropy(out[:-1].reshape(72, -1), b["action"].transpose(0, 1).reshape(72))
        cold, _, _, _ = net.unroll(b["obs"].transpose(0, 1), torch.zeros_like(b["h0"]), torch.zeros_like(b["c0"]),
                                   b["first"].transpose(0, 1))
        logp0, _ = net.log_prob_entropy(cold[:-1].reshape(72, -1), b["action"].transpose(0, 1).reshape(72))
        losses = impala_losses(net, b, 0.99, 1.0, 1.0, 1.0, 0.5, 0.01)
    assert np.allclose(logp.numpy().reshape(8, 9).T, rec["logp"], atol=1e-5)
    assert not np.allclose(logp0.numpy().reshape(8, 9).T, rec["logp"], atol=1e-4)
    assert float(losses.rho_clipped) == 0.0  # the same policy: every importance ratio is 1
    assert learner.train_step(rec) is not None


def test_impalas_recurrent_value_of_a_truncated_episodes_final_observation_reads_that_episodes_state():
    """A time limit cuts an episode: the record's bootstrap value is the value of the final observation from the
    core's state of that episode (which the step's decision moved), not from a zero state."""
    from mpirl.agents.actor_critic import trajectory_spec
    from mpirl.algos.impala.serving import ImpalaDeciding, with_version
    from mpirl.envs.outcomes import Outcome
    cfg, spaces = _impala("env.envs_per_actor=1", "impala.unroll=3")
    spec = trajectory_spec(spaces.obs_shape, spaces.obs_dtype, 3, spaces.action, state_size=32)
    d = ImpalaDeciding(cfg, spaces, spec, [1])
    d.policy.load_flat(with_version(0.3 * np.random.default_rng(0).normal(size=d.policy.n_params)
                                    .astype(np.float32), 0))

    def outcome(x, truncated=False, fresh=False):
        rows = {"obs": np.full((1, 2), x, np.float32), "reward": np.ones(1), "terminated": np.zeros(1, bool),
                "truncated": np.array([truncated]), "life_lost": np.zeros(1, bool), "taken": np.zeros(1, np.int64),
                "final_obs": np.full((1, 2), 9.0, np.float32)}
        return Outcome(rows, fresh)
    prev = outcome(0.1, fresh=True)
    d.observe(0, prev)
    for x, cut in ((0.2, False), (0.3, True)):
        d.decide([0], [prev])
        if cut:
            h, c = d.h.copy(), d.c.copy()
        prev = outcome(x, truncated=cut)
        d.observe(0, prev)
    want = d.policy.values(np.full((1, 2), 9.0, np.float32), h, c)[0]
    cold = d.policy.values(np.full((1, 2), 9.0, np.float32), 0 * h, 0 * c)[0]
    assert d.traj["final_value"][0, 1] == pytest.approx(want) and abs(want - cold) > 1e-4
    assert d.traj["first"][0, :3].tolist() == [True, False, True]  # the next step starts an episode


@pytest.mark.mpi
def test_an_lstm_impala_job_served_by_an_inference_worker_runs_checkpoints_and_resumes(tmp_path, capsys):
    """The LSTM IMPALA job with its games' states kept by an inference worker (5 ranks): every role exits 0, the
    worker served steps, the learner trained on the trajectories and played its test round with the core; --resume
    from its final checkpoint continues to a later stop with the LSTM's parameters restored."""
    import h5py

    from conftest import run_mpi
    from mpirl.bench.continuous import best_window_mean
    job = JOBS / "impala_cartpole_novelocity.toml"
    sets = ("run.target_return=nan", "run.env_steps=0", "run.wall_seconds=0", "topology.workers=1",
            "impala.test_episodes=4")
    first = run_mpi(5, tmp_path, "run.train_steps=40", *sets, job=job, timeout=600)
    assert first.proc.returncode == 0, first.output
    with h5py.File(first.run_dir / "run.h5", "r") as f:
        assert f.attrs["stop_reason"] == "train_steps 40 reached"
        assert f["worker_2/worker/steps_served"][-1] > 0
        assert f["learner/test/episodes"][-1] == 4 and np.isfinite(f["learner/test/return_mean"][-1])
    assert np.isfinite(best_window_mean(first.run_dir))
    again = run_mpi(5, tmp_path, "run.train_steps=80", *sets, job=job, timeout=600,
                    args=("--resume", str(first.run_dir)))
    assert again.proc.returncode == 0, again.output
    with h5py.File(first.run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["stop_reason"] == "train_steps 80 reached"
        assert f["learner/train/train_steps"][-1] == 80
    _the_trained_lstm_carries_its_state_outside_the_job(first.run_dir, tmp_path, capsys)


def _the_trained_lstm_carries_its_state_outside_the_job(run_dir, tmp_path, capsys):
    """The policy of a checkpoint steps its LSTM's state from call to call and zeroes it where an episode starts;
    play samples or takes the mode; the export is checked along played episodes, the state passed in and out."""
    import mpirl
    from conftest import in_process
    policy = mpirl.load_policy(run_dir)
    obs = np.array([[0.1, -0.2], [0.0, 0.3]], np.float32)
    a, state = policy.act(obs)
    assert policy.recurrent and a.shape == (2,) and state[0].shape == (2, policy.state_size)
    _, moved = policy.act(obs, state)
    assert not np.allclose(moved[0], state[0])
    assert np.allclose(policy.act(obs, state, episode_start=[True, True])[1][0], state[0])  # zeroed first
    for extra in ((), ("--stochastic",)):
        play = in_process(capsys, "play", str(run_dir), "--episodes", "2", *extra)
        assert play.returncode == 0 and "over 2 episodes" in play.stdout, play.stdout + play.stderr
    export = in_process(capsys, "export", str(run_dir), "--out", str(tmp_path / "lstm.pt"))
    assert export.returncode == 0 and "(obs, h, c, first) -> (actions, h, c)" in export.stdout, export.stderr
