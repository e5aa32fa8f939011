"""An IMPALA actor's policy: the feed-forward MLP actor-critic computed in numpy is the torch network's, to float32
rounding, from the same broadcast vector (normalisation statistics and the version included), and an actor on
vector observations never imports torch."""

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from mpirl.agents.actor_critic import ActorCriticPolicy
from mpirl.agents.actor_critic_acting import MLPActorCritic, actor_critic_acting, mlp_actor_critic_shapes
from mpirl.agents.sampling import sample
from mpirl.config import JobConfig
from mpirl.envs.actions import action_spec, discrete

BOX = action_spec(gym.spaces.Box(-2, 2, (3,), np.float32), "box")
MULTI = action_spec(gym.spaces.MultiDiscrete([3, 4]), "multi")

# Each case: observation shape and dtype, the action space, hidden widths, activation, shared torso, normalised obs.
CASES = [((4,), np.float32, discrete(2), [64, 64], "relu", True, False),
         ((3,), np.float32, BOX, [64, 64], "tanh", False, True),
         ((8,), np.float64, MULTI, [32], "relu", True, True),
         ((11,), np.float32, discrete(5), [32, 16, 8], "tanh", True, False),
         ((2, 5, 5), np.uint8, discrete(4), [64, 32], "relu", False, False)]


def agent(hidden, activation="relu", shared=True, normalize=False, network="mlp", recurrent="none"):
    a = JobConfig().agent
    a.hidden, a.activation, a.shared_torso, a.normalize_obs = list(hidden), activation, shared, normalize
    a.network, a.recurrent, a.log_std_init = network, recurrent, -0.3
    return a


def observations(rng, obs_shape, dtype, n):
    if dtype == np.uint8:
        return rng.integers(0, 256, size=(n, *obs_shape), dtype=np.uint8)
    return (2.0 * rng.standard_normal((n, *obs_shape)) + 0.5).astype(dtype)


def broadcast(torch_policy, rng) -> np.ndarray:
    """The vector the learner would broadcast: the torch network's parameters (well away from zero: every unit's
    sign is decided) and, when normalised, statistics with a mean and spread of their own."""
    with torch.no_grad():
        for p in torch_policy.net.parameters():
            p.mul_(3.0)
    flat = torch.nn.utils.parameters_to_vector(torch_policy.net.parameters()).numpy().astype(np.float32)
    stats = np.zeros(torch_policy.norm.n_stats, np.float32)
    if torch_policy.norm.on:
        norm = torch_policy.norm
        norm.obs.mean[...] = rng.standard_normal(norm.obs.mean.shape)
        norm.obs.var[...] = rng.uniform(0.5, 4.0, norm.obs.var.shape)
        norm.obs.count = 100.0
        norm.stats_flat(stats)
    return np.concatenate([flat, stats])


@pytest.mark.numerical
@pytest.mark.parametrize("obs_shape,dtype,action,hidden,activation,shared,normalize", CASES)
def test_the_numpy_actor_critic_computes_the_torch_networks_outputs_and_values(obs_shape, dtype, action, hidden,
                                                                               activation, shared, normalize):
    a = agent(hidden, activation, shared, normalize)
    torch.manual_seed(0)
    theirs = ActorCriticPolicy(obs_shape, action, a, dtype)
    rng = np.random.default_rng(1)
    flat = broadcast(theirs, rng)
    theirs.load_flat(flat)
    ours = actor_critic_acting(obs_shape, action, a, dtype)
    assert isinstance(ours, MLPActorCritic) and ours.n_params == theirs.n_params == len(flat)
    assert [s for _, s in mlp_actor_critic_shapes(int(np.prod(obs_shape)), action, hidden, shared)] == [
        tuple(p.shape) for p in theirs.net.parameters()]  # the torch module's order
    ours.load_flat(flat)
    obs = observations(rng, obs_shape, dtype, 64)
    want, got = theirs.outputs(obs), ours.outputs(obs)
    assert got.dtype == np.float64 and got.shape == (64, action.n_outputs)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)
    v_want, v_got = theirs.values(obs), ours.values(obs)
    assert v_got.dtype == np.float32 and v_got.shape == (64,)
    np.testing.assert_allclose(v_got, v_want, rtol=0, atol=1e-5 * np.abs(v_want).max())
    if action.continuous:
        np.testing.assert_array_equal(ours.log_std, theirs.log_std)
        assert np.allclose(ours.log_std, -0.3 * 3.0)  # the broadcast's, not the start's
    else:  # each categorical's log-probabilities sum to one
        for part in np.split(got, np.cumsum(action.nvec)[:-1], axis=1):
            np.testing.assert_allclose(np.exp(part).sum(axis=1), 1.0, atol=1e-12)
    # The same random stream samples the same actions where no two choices are within rounding of a tie.
    acts_ours, logp_ours = sample(action, got, ours.log_std, np.random.default_rng(5))
    acts_theirs, logp_theirs = sample(action, want, theirs.log_std, np.random.default_rng(5))
    gap = np.abs(acts_ours.reshape(64, -1).astype(np.float64) - acts_theirs.reshape(64, -1))
    same = np.all(gap <= (1e-5 * scale if action.continuous else 0), axis=1)  # a Gaussian's: to rounding
    assert same.mean() > 0.9, same.mean()
    np.testing.assert_allclose(logp_ours[same], logp_theirs[same], rtol=0, atol=1e-3 * max(1.0, scale))


def test_a_wrong_length_broadcast_is_refused():
    ours = MLPActorCritic((4,), 2, agent([8]))
    with pytest.raises(ValueError, match="values for a network and statistics of"):
        ours.load_flat(np.zeros(ours.n_params + 1, np.float32))


def test_the_policy_is_numpy_for_a_feed_forward_mlp_and_torch_for_convolutions_and_the_lstm():
    assert isinstance(actor_critic_acting((4,), 2, agent([64, 64], network="auto")), MLPActorCritic)
    assert isinstance(actor_critic_acting((4, 10, 10), 3, agent([64], network="auto")), ActorCriticPolicy)
    assert isinstance(actor_critic_acting((4,), 2, agent([64], recurrent="lstm")), ActorCriticPolicy)
    assert isinstance(actor_critic_acting((4, 10, 10), 3, agent([64], network="mlp")), MLPActorCritic)


def test_an_impala_actor_on_vector_observations_plays_and_records_without_torch():
    # The modules an actor rank imports (the wiring, IMPALA's algorithm and builder, the actor loop), then its games
    # and decisions on CartPole until trajectories are staged: torch is never imported. The spec is rank 0's
    # (mpirl.agents.actor_critic.trajectory_spec, beside the torch learner), made in this process first and handed
    # over as text, as rank 0's checks hand it to the other ranks.
    from mpirl.agents.actor_critic import trajectory_spec
    spec = trajectory_spec((4,), np.dtype(np.float32), 20, discrete(2))
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import mpirl.job.wiring, mpirl.algos.impala.algorithm, mpirl.algos.impala.builder, mpirl.actor_learner.actor
        from mpirl import config
        from mpirl.algos.impala.serving import ImpalaDeciding, with_version
        from mpirl.actor_learner.actor import Acting
        from mpirl.envs.games import VectorGames
        from mpirl.envs.actions import discrete
        cfg, _ = config.load("jobs/impala_cartpole.toml", ["impala.unroll=20"])
        spec = {k: (tuple(s), np.dtype(d)) for k, (s, d) in SPEC.items()}
        spaces = type("S", (), {"obs_shape": (4,), "obs_dtype": np.dtype(np.float32), "action": discrete(2)})()
        a = Acting(VectorGames(cfg, spaces, 3, "actor 0"), ImpalaDeciding(cfg, spaces, spec, [3]))
        a.policy.load_flat(with_version((np.random.default_rng(0).standard_normal(a.policy.n_params) * 0.1
                                         ).astype(np.float32), 4))
        a.start()
        shipped = 0
        for _ in range(200):
            a.step()
            if a.staged:  # as the actor ships: every game's finished trajectories, acted with version 4
                records, _ = a.take(a.staged)
                assert (records["version"] == 4).all() and records["obs"].shape[1:] == (21, 4)
                assert np.isfinite(records["logp"]).all() and (records["logp"] <= 0).all()
                shipped += len(records["action"])
                a.drop(len(records["action"]))
        assert shipped >= 8 * cfg.env.envs_per_actor, shipped
        a.close()
        print("torch" in sys.modules, type(a.policy.inner).__name__)
        """)
    code = code.replace("SPEC", repr({k: (list(s), str(d)) for k, (s, d) in spec.items()}))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "MLPActorCritic"], proc.stdout
