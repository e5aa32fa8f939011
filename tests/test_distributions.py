"""The sampling policies' action distributions and action spaces (no MPI): the Gaussian's and the categoricals'
log-probabilities and entropies against ``torch.distributions``, the actors' numpy side against the learners' torch
side, clipping at the env while the stored action and its log-probability are the unclipped sample, and the spaces
taken (Discrete with a start, MultiDiscrete, Box of any shape, bounded or not, Dict observations) and refused."""

from __future__ import annotations

import math
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Independent, Normal

import tests.odd_spaces_env  # noqa: F401 - registers the environments
from mpirl.agents.actor_critic import ActorCritic, trajectory_spec
from mpirl.agents.distributions import (actor_outputs, categorical_log_prob_entropy, gaussian_entropy,
                                        gaussian_log_prob, log_prob_entropy)
from mpirl.agents.sampling import log_prob, sample
from mpirl.config import ConfigError, EnvConfig
from mpirl.envs.actions import action_spec, discrete
from mpirl.envs.factory import make_env, policy_env_spaces
from mpirl.envs.vector import GymVector

pytestmark = pytest.mark.numerical  # float results held under each of MKL's kernel branches: test_cpu_kernels.py

BOX = action_spec(gym.spaces.Box(-2, 2, (3,), np.float32), "box")
MULTI = action_spec(gym.spaces.MultiDiscrete([3, 4]), "multi")


# ------------------------------------------------------------------ the Gaussian, against torch.distributions
def test_the_gaussian_log_probability_by_hand_and_against_torch():
    """N(0, 1) at 1: -1/2 - log(2 pi)/2 per dimension; then random means, log stds and points against
    ``Independent(Normal)``; the entropy sum(log std) + D (1 + log 2 pi) / 2 likewise."""
    one = gaussian_log_prob(torch.zeros(1, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64),
                            torch.ones(1, 2, dtype=torch.float64))
    assert one.item() == pytest.approx(2 * (-0.5 - 0.5 * math.log(2 * math.pi)), abs=1e-12)
    assert gaussian_entropy(torch.tensor([0.0, math.log(2.0)], dtype=torch.float64), 1).item() == pytest.approx(
        1 + math.log(2 * math.pi) + math.log(2.0), abs=1e-12)
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(7, 3, generator=g, dtype=torch.float64)
    log_std = torch.randn(3, generator=g, dtype=torch.float64)
    x = mean + 3 * torch.randn(7, 3, generator=g, dtype=torch.float64)  # far out too
    ref = Independent(Normal(mean, log_std.exp().expand(7, 3)), 1)
    assert torch.allclose(gaussian_log_prob(mean, log_std, x), ref.log_prob(x), atol=1e-12)
    assert torch.allclose(gaussian_entropy(log_std, 7), ref.entropy(), atol=1e-12)
    logp, ent = log_prob_entropy(BOX, mean, log_std, x)
    assert torch.allclose(logp, ref.log_prob(x), atol=1e-12) and torch.allclose(ent, ref.entropy(), atol=1e-12)


def test_the_categoricals_of_a_multidiscrete_space_against_torch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 7, generator=g, dtype=torch.float64)
    actions = torch.stack([torch.randint(3, (5,), generator=g), torch.randint(4, (5,), generator=g)], 1)
    first, second = Categorical(logits=logits[:, :3]), Categorical(logits=logits[:, 3:])
    logp, ent = categorical_log_prob_entropy(logits, (3, 4), actions)
    assert torch.allclose(logp, first.log_prob(actions[:, 0]) + second.log_prob(actions[:, 1]), atol=1e-12)
    assert torch.allclose(ent, first.entropy() + second.entropy(), atol=1e-12)
    one = Categorical(logits=logits[:, :3])  # one Discrete dimension: actions [N]
    logp, ent = categorical_log_prob_entropy(logits[:, :3], (3,), actions[:, 0])
    assert torch.allclose(logp, one.log_prob(actions[:, 0]), atol=1e-12)
    assert torch.allclose(ent, one.entropy(), atol=1e-12)


# ------------------------------------------------------------------ the actors' side agrees with the learners'
@pytest.mark.parametrize("spec", [discrete(4), MULTI, BOX], ids=["discrete", "multidiscrete", "box"])
def test_an_actors_stored_log_probability_is_what_the_learner_computes_from_the_stored_action(spec):
    """The actor samples in numpy (float64, its own generator) and stores the action as its spec's dtype; the
    learner recomputes the log-probability in torch from the stored action: the same number (float32's rounding)."""
    net = ActorCritic((5,), spec, [16], log_std_init=-0.5).double()
    obs = torch.as_tensor(np.random.default_rng(2).normal(size=(64, 5)))
    out, _ = net(obs)
    log_std = None if net.log_std is None else net.log_std.detach().numpy()
    actions, logp = sample(spec, actor_outputs(spec, out), log_std, np.random.default_rng(3))
    assert actions.shape == (64, *spec.shape) and actions.dtype == spec.dtype and logp.dtype == np.float32
    stored = torch.as_tensor(actions)
    again, _ = net.log_prob_entropy(out, stored)
    assert np.allclose(again.detach().numpy(), logp, rtol=1e-6, atol=1e-6)
    assert np.array_equal(log_prob(spec, actor_outputs(spec, out), log_std, actions), logp)


def test_a_gaussian_samples_past_the_bounds_the_env_gets_them_clipped_and_the_record_keeps_the_sample():
    """Means at 0.9 and a wide policy: about half the samples fall outside [-1, 1]. The env receives them clipped
    (ClippedBox asserts so); the stored action is the unclipped sample, and its log-probability is the sample's,
    not the clipped action's."""
    spec = action_spec(gym.spaces.Box(-1, 1, (2,), np.float32), "ClippedBox-v0")
    out, log_std = np.full((256, 2), 0.9), np.zeros(2)
    actions, logp = sample(spec, out, log_std, np.random.default_rng(4))
    outside = np.abs(actions) > 1
    assert 0.3 < outside.mean() < 0.7
    clipped = np.stack([spec.to_env(a) for a in actions])
    assert np.all(np.abs(clipped) <= 1) and np.array_equal(clipped[~outside], actions[~outside])
    want = Independent(Normal(torch.as_tensor(out), torch.ones(256, 2, dtype=torch.float64)), 1).log_prob(
        torch.as_tensor(actions, dtype=torch.float64)).numpy()
    assert np.allclose(logp, want, atol=1e-5)
    assert not np.allclose(logp, log_prob(spec, out, log_std, clipped), atol=1e-3)
    vec = GymVector(EnvConfig(id="tests.odd_spaces_env:ClippedBox-v0"), 256, seed=0)
    try:
        vec.reset()
        step = vec.step(actions)  # ClippedBox asserts that every action it receives is inside its bounds
        assert np.allclose(step.reward, -np.square(clipped - 0.5).sum(1))
    finally:
        vec.close()


# ------------------------------------------------------------------ spaces
def test_the_spaces_taken_and_how_their_actions_reach_the_env():
    pend = policy_env_spaces(EnvConfig(id="Pendulum-v1"))[2]
    assert pend.kind == "box" and pend.shape == (1,) and pend.bounded and pend.dtype == np.float32
    assert pend.to_env(np.array([5.0])).tolist() == [2.0]
    free = policy_env_spaces(EnvConfig(id="tests.odd_spaces_env:UnboundedBox-v0"))[2]
    assert free.shape == (2, 2) and not free.bounded and free.n_outputs == 4
    assert free.to_env(np.arange(4.0) * 100).tolist() == [[0, 100], [200, 300]]  # as sampled, in its shape
    multi = policy_env_spaces(EnvConfig(id="tests.odd_spaces_env:MultiDiscreteActions-v0"))[2]
    assert multi.kind == "multidiscrete" and multi.nvec == (3, 4) and multi.n_outputs == 7
    start = policy_env_spaces(EnvConfig(id="tests.odd_spaces_env:StartOneCartPole-v0"))[2]
    assert start == action_spec(gym.spaces.Discrete(2, start=1), "x") and start.to_env(np.int64(0)) == 1
    vec = GymVector(EnvConfig(id="tests.odd_spaces_env:StartOneCartPole-v0"), 2, seed=0)
    try:
        vec.reset()
        vec.step(np.array([0, 1]))  # the env asserts it gets 1 and 2
    finally:
        vec.close()
    shape, dtype, act = policy_env_spaces(EnvConfig(id="tests.odd_spaces_env:DictObservation-v0"))
    assert shape == (5,) and act == discrete(2)  # Box(2) and Discrete(3) one-hot, flattened by Gymnasium
    assert make_env(EnvConfig(id="tests.odd_spaces_env:DictObservation-v0")).observation_space.shape == (5,)
    assert trajectory_spec((3,), np.float32, 5, pend)["action"] == ((5, 1), np.dtype(np.float32))
    assert trajectory_spec((3,), np.float32, 5, multi)["action"] == ((5, 2), np.dtype(np.int64))
    assert trajectory_spec((3,), np.float32, 5)["action"] == ((5,), np.dtype(np.int64))


@pytest.mark.parametrize("space,says", [
    (gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), "Discrete, MultiDiscrete and Box"),
    (gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3))), "Discrete, MultiDiscrete and Box"),
    (gym.spaces.MultiBinary(3), "Discrete, MultiDiscrete and Box"),
    (gym.spaces.Box(0, 5, (2,), np.int64), "integer boxes"),
])
def test_an_action_space_no_policy_takes_is_refused_naming_env_id(space, says):
    with pytest.raises(ConfigError) as err:
        action_spec(space, "Some-v0")
    assert err.value.key == "env.id" and says in err.value.message and "Some-v0" in err.value.message


# ------------------------------------------------------------------ learning a little, no MPI
def test_a_few_a2c_steps_on_a_multidiscrete_bandit_raise_the_paying_choices():
    """MultiDiscreteActions pays 1 for each dimension at its last choice; a few A2C gradients on rollouts of the
    real env (through the gradient family's model) raise the probability of both."""
    from mpirl.agents.a3c import A3cModel, Rollout
    cfg = EnvConfig(id="tests.odd_spaces_env:MultiDiscreteActions-v0")
    shape, dtype, spec = policy_env_spaces(cfg)
    agent = SimpleNamespace(hidden=[16], network="auto", activation="relu", shared_torso=True, log_std_init=0.0,
                            weight_init="torch", lr=3e-2, adam_eps=1e-8, grad_clip=10.0, gamma=0.0,
                            normalize_obs=False, recurrent="none", normalize_reward=False, normalized_obs_clip=10.0,
                            normalized_reward_clip=10.0)
    a3c = SimpleNamespace(optimizer="adam", loss="a2c", value_coef=0.5, entropy_coef=0.0, gae_lambda=1.0, clip=0.2)
    model = A3cModel(shape, spec, agent, a3c, torch.device("cpu"), seed=0, optimizer=True)
    vec, rng = GymVector(cfg, 8, seed=0), np.random.default_rng(0)

    def p_best(obs) -> float:
        out = actor_outputs(spec, model.net(torch.as_tensor(obs))[0])
        return float(np.exp(out[:, 2] + out[:, 3 + 3]).mean())

    try:
        obs = vec.reset()
        before = p_best(obs)
        grad = np.zeros(model.n_params, np.float32)
        for _ in range(30):
            ro = Rollout(4, 8, shape, dtype, spec)
            for t in range(4):
                actions, logp, values = model.act(obs, rng)
                step = vec.step(actions)
                ro.obs[t], ro.action[t], ro.logp[t], ro.value[t] = obs, actions, logp, values
                ro.reward[t], ro.terminated[t] = step.reward, step.terminated
                obs = step.obs
            ro.steps = 4
            assert model.gradient(model.prepare(ro), None, grad) is not None
            model.apply(grad)
        assert p_best(obs) > max(0.5, 3 * before), (before, p_best(obs))
    finally:
        vec.close()


# ------------------------------------------------------------------ running statistics
def test_running_statistics_folded_in_pieces_equal_one_pass_and_normalise():
    """Moments counted in pieces and folded in any grouping (Chan's update) give one pass's mean and variance; the
    normalisation clips; the rewards are divided by the spread of each game's discounted return, which restarts where
    an episode ends."""
    from mpirl.agents.running_stats import Moments, Normalization, RunningStats
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1000, 2)) * [3.0, 0.01] + [50.0, -2.0]
    stats = RunningStats((2,))
    for part in np.array_split(x, 7):
        m, out = Moments((2,)), np.zeros(5)
        m.add(part)
        m.take(out)
        stats.fold(out)
        assert not m.values.any()  # taken: counting starts afresh
    assert stats.count == 1000 and np.allclose(stats.mean, x.mean(0)) and np.allclose(stats.var, x.var(0))
    norm = Normalization((2,), obs=True, reward=True, gamma=0.5, obs_clip=5.0, reward_clip=10.0)
    norm.obs.load(stats.flat())
    z = norm.normalize(x)
    assert z.dtype == np.float32 and np.allclose(z.mean(0), 0, atol=1e-5) and np.allclose(z.std(0), 1, atol=1e-4)
    assert norm.normalize(np.array([[1e6, -1e6]])).tolist() == [[5.0, -5.0]]  # clipped
    norm.ret.load(np.array([10.0, 0.0, 4.0]))  # std 2
    assert norm.rewards(np.array([1.0, 2.0]), np.array([False, True])).tolist() == [0.5, 1.0]
    norm.rewards(np.array([1.0, 1.0]), np.array([False, False]))
    out = np.zeros(norm.n_moments)
    norm.take_moments(out)
    # the returns counted: game 0 1 then 1.5; game 1 2 then (restarted) 1
    assert out[-3:].tolist() == [4.0, 1 + 2 + 1.5 + 1, 1 + 4 + 2.25 + 1]
    norm.restart()  # the games rebuilt: no discounted return goes on (game 0's 1.5 is not carried on)
    norm.rewards(np.array([2.0, 2.0]), np.array([False, False]))
    norm.take_moments(out)
    assert out[-3:].tolist() == [2.0, 4.0, 8.0]


def test_uint8_images_are_normalised_pixel_by_pixel_after_the_networks_scaling():
    """Sample Factory's normalize_input on Atari: the statistics are those of the pixels / 255 (no shift: the
    reference is ignored), a pixel that never changes (the background) normalises to 0, one that moves to its own
    z-score, clipped; the trained policy's module takes the raw uint8 frames and gives the same numbers."""
    import torch

    from mpirl.agents.deployed import Normalize
    from mpirl.agents.running_stats import PIXEL_SCALE, input_scale, needs_shift, normalization
    from mpirl.agents.networks import image_floats
    agent = SimpleNamespace(normalize_obs=True, normalize_reward=False, gamma=0.99, normalized_obs_clip=5.0,
                            normalized_reward_clip=10.0)
    assert input_scale(np.uint8) == PIXEL_SCALE and input_scale(np.float32) == 1.0 and input_scale(None) == 1.0
    assert not needs_shift(agent, np.uint8) and needs_shift(agent, np.float32)
    assert torch.equal(image_floats(torch.full((1,), 255, dtype=torch.uint8)), torch.ones(1))  # the same 1/255
    rng = np.random.default_rng(3)
    x = np.full((256, 4, 6, 6), 87, np.uint8)  # the background
    x[:, :, 2, 3] = rng.integers(0, 256, (256, 4))  # a pixel that moves
    x[:3, 0, 4, 4] = 255  # one that is lit in 3 frames of 256: rare, so far from its mean
    norm = normalization((4, 6, 6), agent, obs_shift=np.full((4, 6, 6), 1e6), obs_dtype=np.uint8)
    z = norm.observe(x)  # counted, normalised with the statistics before (identity: x / 255)
    assert z.dtype == np.float32 and np.allclose(z, x / 255.0)
    norm.fold_counted()
    assert norm.obs.count == 256 and np.allclose(norm.obs.mean.reshape(4, 6, 6), (x / 255.0).mean(0))
    assert np.allclose(norm.obs.var.reshape(4, 6, 6), (x / 255.0).var(0))
    z = norm.normalize(x)
    assert np.abs(z[:, :, 0, 0]).max() < 1e-6  # the background: its mean (to the sums' rounding)
    moving = x[:, 0, 2, 3] / 255.0
    assert np.allclose(z[:, 0, 2, 3], (moving - moving.mean()) / moving.std(), atol=1e-5)
    assert z[0, 0, 4, 4] == 5.0  # (1 - 3/256) / its spread is about 9: clipped to normalized_obs_clip
    # raw pixels in, as the exported policy takes them; it computes in float64 where the job's pixels are float32,
    # whose rounding (about 1e-8) a still pixel's floor sd (sqrt(1e-8)) makes about 1e-4
    deployed = Normalize(norm)(torch.as_tensor(x)).numpy()
    assert deployed.dtype == np.float32 and np.allclose(deployed, z, atol=1e-3)


def test_a_learners_batch_of_frames_is_scaled_once_counted_from_a_view_and_normalised_as_in_two_passes():
    """IMPALA's learner counts each trajectory step's stack once (not the bootstrap one) and normalises every stack:
    one scaled array serves both, counted through a strided view without a copy; the statistics and the inputs are
    those of counting a contiguous copy and normalising the raw frames apart."""
    from mpirl.agents.running_stats import normalization
    agent = SimpleNamespace(normalize_obs=True, normalize_reward=False, gamma=0.99, normalized_obs_clip=5.0,
                            normalized_reward_clip=10.0)
    rng = np.random.default_rng(5)
    frames = rng.integers(0, 256, (3, 6, 2, 5, 5), dtype=np.uint8)  # 3 trajectories of 5 steps + the bootstrap
    one, two = (normalization((2, 5, 5), agent, obs_dtype=np.uint8) for _ in range(2))
    before = rng.integers(0, 256, (7, 2, 5, 5), dtype=np.uint8)
    for n in (one, two):  # the same statistics, not the identity's, before the batch
        n.observe(before)
        n.fold_counted()
    x = one.scaled(frames)
    view = x[:, :-1]
    assert not view.flags.c_contiguous
    one.count(obs=view, scaled=True)
    one.fold_counted()
    z1 = one.normalize(x.reshape(-1, 2, 5, 5), scaled=True)
    two.count(obs=np.ascontiguousarray(frames[:, :-1]).reshape(-1, 2, 5, 5))
    two.fold_counted()
    z2 = two.normalize(frames.reshape(-1, 2, 5, 5))
    assert one.obs.count == two.obs.count == 7 + 15
    assert np.allclose(one.obs.mean, two.obs.mean, rtol=0, atol=1e-12)
    assert np.allclose(one.obs.var, two.obs.var, rtol=0, atol=1e-12)
    assert z1.dtype == np.float32 and np.array_equal(z1, z2)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 4])
def test_moments_merged_across_ranks_equal_one_pass_over_all_their_data(ranks):
    from conftest import ROOT, run_mpi_script
    code, text = run_mpi_script(ranks, ROOT / "tests" / "stats_job.py", timeout=120)
    assert code == 0 and f"ok {ranks}" in text, text
