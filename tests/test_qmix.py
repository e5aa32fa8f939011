"""QMIX pieces: f(pi), TD(lambda) targets, monotonic mixing, action masks, learning, skipped batches, round trips."""

import itertools

import numpy as np
import pytest
import torch

from mpirl.agents.qmix import QmixHyper, episode_spec, f_pi, td_lambda_targets
from mpirl.agents.qmix_learner import QMixLearner
from mpirl.agents.qmix_networks import QMixer, agent_inputs
from mpirl.agents.qmix_policy import QMixPolicy, epsilon_schedule

pytestmark = pytest.mark.numerical  # float results held under each of MKL's kernel branches: test_cpu_kernels.py


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------- f(pi)

def f_brute(pi: np.ndarray) -> float:
    """1 + sum over single deviations i of prod_{j != i} pi_j - n prod_j pi_j, written out."""
    n = len(pi)
    total = 1.0
    for i in range(n):
        total += np.prod([pi[j] for j in range(n) if j != i])
    return total - n * np.prod(pi)


@pytest.mark.parametrize("n", range(1, 7))
def test_f_pi_matches_the_sum_over_deviations(n):
    rng = np.random.default_rng(n)
    pi = rng.random((50, n))
    pi[:5] = rng.random((5, n)) ** 8          # near zero
    pi[5:10] = 1 - rng.random((5, n)) ** 8    # near one
    got = f_pi(torch.as_tensor(pi)).numpy()
    want = np.array([f_brute(p) for p in pi])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert (got >= 1 - 1e-12).all() and (got <= 2 + 1e-12).all()


def test_f_pi_with_exact_zeros():
    rng = np.random.default_rng(0)
    for n in range(1, 7):
        for zeros in itertools.chain.from_iterable(itertools.combinations(range(n), k) for k in range(n + 1)):
            pi = rng.random(n)
            pi[list(zeros)] = 0.0
            got = float(f_pi(torch.as_tensor(pi)))
            assert got == pytest.approx(f_brute(pi), abs=1e-12)
            if len(zeros) >= 2:
                assert got == 1.0  # every product over n-1 agents keeps a zero
            if len(zeros) == 1:
                assert got == pytest.approx(1 + np.prod(np.delete(pi, zeros[0])))
    assert float(f_pi(torch.ones(4))) == 1.0 and float(f_pi(torch.zeros(1))) == 2.0


# ------------------------------------------------------------------------------------------- TD(lambda)

def lambda_return_naive(r, q, L, terminated, gamma, lam):
    """Forward view: G^lam_t = (1-lam) sum_{k<K} lam^(k-1) G^(k)_t + lam^(K-1) G^(K)_t, K = L - t steps left."""
    qv = list(q[:L + 1])
    if terminated:
        qv[L] = 0.0
    out = []
    for t in range(L):
        K = L - t

        def g_k(k):
            return sum(gamma ** i * r[t + i] for i in range(k)) + gamma ** k * qv[t + k]
        out.append((1 - lam) * sum(lam ** (k - 1) * g_k(k) for k in range(1, K)) + lam ** (K - 1) * g_k(K))
    return out


def test_td_lambda_targets_match_a_naive_recursion():
    rng = np.random.default_rng(1)
    T, gamma, lam = 7, 0.9, 0.6
    lengths = [7, 3, 5, 1, 7, 4]
    term = [False, True, False, True, True, False]  # 2: truncated short; 4: terminated at the limit
    B = len(lengths)
    r = rng.normal(size=(B, T)).astype(np.float64)
    q = rng.normal(size=(B, T + 1))
    filled = np.zeros((B, T), bool)
    terminated = np.zeros((B, T), bool)
    for i, (L, d) in enumerate(zip(lengths, term)):
        filled[i, :L] = True
        terminated[i, L - 1] = d
        r[i, L:] = np.nan  # padding must not leak
        q[i, L + 1:] = 1e6
    y = td_lambda_targets(torch.as_tensor(r), torch.as_tensor(terminated), torch.as_tensor(filled),
                          torch.as_tensor(q), gamma, lam).numpy()
    for i, (L, d) in enumerate(zip(lengths, term)):
        np.testing.assert_allclose(y[i, :L], lambda_return_naive(r[i], q[i], L, d, gamma, lam), rtol=1e-12)
        assert (y[i, L:] == 0).all()
    # the truncated short episode bootstraps from its last state, the terminated one does not
    assert y[2, 4] == pytest.approx(r[2, 4] + gamma * q[2, 5])
    assert y[1, 2] == pytest.approx(r[1, 2])
    # lambda = 0: one-step targets
    y0 = td_lambda_targets(torch.as_tensor(r), torch.as_tensor(terminated), torch.as_tensor(filled),
                           torch.as_tensor(q), gamma, 0.0).numpy()
    assert y0[0, 2] == pytest.approx(r[0, 2] + gamma * q[0, 3])


# ------------------------------------------------------------------------------------------- mixer, masks

def test_qmixer_is_monotonic_in_every_agent_q():
    torch.manual_seed(0)
    for n in (1, 3, 8):
        mixer = QMixer(n, state_dim=6)
        qs = (torch.randn(256, n) * 5).requires_grad_(True)
        states = torch.randn(256, 6) * 3
        mixer(qs, states).sum().backward()
        assert (qs.grad >= 0).all()
        # and directly: raising any agent's Q never lowers Q_tot
        bumped = qs.detach().clone()
        bumped[:, n - 1] += 1.0
        assert (mixer(bumped, states) >= mixer(qs.detach(), states) - 1e-5).all()


def test_policy_never_picks_an_unavailable_action():
    rng = np.random.default_rng(2)
    E, n, A = 16, 3, 6
    pol = QMixPolicy(n, (4,), A, hidden=16)
    pol.reset(E)
    for eps, greedy in ((1.0, False), (0.5, False), (0.0, True), (1.0, True)):
        for _ in range(20):
            avail = rng.random((E, n, A)) < 0.3
            avail[np.arange(E), :, rng.integers(A, size=E)] = True  # at least one each
            obs = rng.integers(0, 2, size=(E, n, 4)).astype(np.uint8)
            a = pol.act(obs, avail, eps, rng, greedy=greedy)
            assert a.shape == (E, n) and a.dtype == np.int64
            assert avail[np.arange(E)[:, None], np.arange(n)[None, :], a].all()
    # uniform over the available actions when exploring
    avail = np.zeros((E, n, A), bool)
    avail[..., [1, 4]] = True
    picks = np.concatenate([pol.act(np.zeros((E, n, 4), np.uint8), avail, 1.0, rng).ravel() for _ in range(60)])
    assert set(picks) == {1, 4} and abs((picks == 1).mean() - 0.5) < 0.06


def test_epsilon_schedule_is_linear_then_flat():
    assert epsilon_schedule(0) == 1.0 and epsilon_schedule(25_000) == pytest.approx(0.525)
    assert epsilon_schedule(50_000) == pytest.approx(0.05) and epsilon_schedule(10**7) == pytest.approx(0.05)


# ------------------------------------------------------------------------------------------- a game to learn

N, A, S, LIMIT = 2, 4, 3, 3  # two agents, action 3 never available, 3 states, up to 3 steps


def play(rng, n_episodes, policy=None, epsilon=1.0):
    """Coordination game: each step a random state s in {0, 1, 2} (both agents see it); team reward 1 when
    both agents pick action s, else 0. Episodes end after 1-3 steps, terminated or truncated at random.
    ``policy`` None: uniformly random available actions. Returns (episode batch, mean reward per step)."""
    spec = episode_spec(N, (S,), np.uint8, (S,), np.float32, A, LIMIT)
    b = {k: np.zeros((n_episodes, *shape), dtype) for k, (shape, dtype) in spec.items()}
    if policy is not None:
        policy.reset(n_episodes)
    lengths = rng.integers(1, LIMIT + 1, size=n_episodes)
    rewards = []
    states = rng.integers(S, size=(n_episodes, LIMIT + 1))
    for t in range(LIMIT + 1):
        onehot = np.eye(S, dtype=np.uint8)[states[:, t]]
        b["obs"][:, t] = onehot[:, None, :]
        b["state"][:, t] = onehot
        b["avail"][:, t, :, :3] = True
        live = t < lengths
        if not live.any():
            break
        if policy is None:
            acts = rng.integers(3, size=(n_episodes, N))
        else:
            acts = policy.act(b["obs"][:, t], b["avail"][:, t], epsilon, rng, greedy=epsilon == 0)
        b["actions"][:, t] = np.where(live[:, None], acts, 0)
        rew = ((acts[:, 0] == states[:, t]) & (acts[:, 1] == states[:, t])).astype(np.float32)
        b["reward"][:, t] = np.where(live, rew, 0)
        b["filled"][:, t] = live
        rewards.extend(rew[live])
    ends = np.arange(n_episodes), lengths - 1
    b["terminated"][ends] = rng.random(n_episodes) < 0.5
    for i, L in enumerate(lengths):  # padding past the final state stays zero
        b["obs"][i, L + 1:] = 0
        b["state"][i, L + 1:] = 0
        b["avail"][i, L + 1:] = False
    return b, float(np.mean(rewards))


@pytest.mark.parametrize("weights", ["none", "macpo"])
def test_qmix_learns_the_coordination_game(weights):
    rng = np.random.default_rng(3)
    hp = QmixHyper(lr=3e-3, target_update=25, rnn_hidden=32, mixer_embed=16, hypernet_hidden=32,
                   central_hidden=64, loss_weights=weights, gamma=0.9)
    learner = QMixLearner(N, (S,), (S,), A, hp, seed=0)
    data, random_return = play(rng, 2048)
    assert random_return < 0.2  # 1/9 by chance
    for _ in range(300):
        idx = rng.integers(len(data["reward"]), size=32)
        stats = learner.train_step({k: v[idx] for k, v in data.items()})
        assert not stats["skipped"]
    assert stats["episode_weights"].shape == (32,) and stats["episode_weights"].dtype == np.float64
    if weights == "macpo":
        assert 1.0 <= stats["f_mean"] <= 2.0 and stats["w_mean_raw"] > 0 and np.isfinite(stats["central_loss"])
    else:
        assert np.isnan(stats["central_loss"])
    policy = QMixPolicy(N, (S,), A, hp.rnn_hidden)
    policy.load_flat(learner.flat_params())
    _, greedy_return = play(rng, 256, policy, epsilon=0.0)
    assert greedy_return >= 0.95, f"greedy mean reward {greedy_return} (random {random_return:.3f})"


# ------------------------------------------------------------------------------------------- faults, round trips

def small_learner(weights="macpo", seed=0):
    hp = QmixHyper(rnn_hidden=16, mixer_embed=8, hypernet_hidden=16, central_hidden=32, loss_weights=weights)
    return QMixLearner(N, (S,), (S,), A, hp, seed=seed)


@pytest.mark.parametrize("weights", ["none", "macpo"])
def test_a_nan_reward_batch_is_skipped_and_counted(weights):
    rng = np.random.default_rng(4)
    learner = small_learner(weights)
    batch, _ = play(rng, 8)
    learner.train_step(batch)
    before = {k: v.clone() for k, v in learner.state_dict()["agent"].items()}
    mixer_before = {k: v.clone() for k, v in learner.mixer.state_dict().items()}
    bad = {k: v.copy() for k, v in batch.items()}
    bad["reward"][2, 0] = np.nan
    stats = learner.train_step(bad)
    assert stats["skipped"] and learner.skipped_batches == 1 and learner.steps == 1
    assert "reward" in stats["reason"] and learner.fault.kind == "batch"
    assert stats["episode_weights"] is None
    for k, v in learner.agent.state_dict().items():
        assert torch.equal(v, before[k])
    for k, v in learner.mixer.state_dict().items():
        assert torch.equal(v, mixer_before[k])
    # a NaN in the padding is not a fault
    pad = {k: v.copy() for k, v in batch.items()}
    i = int(np.argmin(pad["filled"].sum(1)))
    pad["reward"][i, LIMIT] = np.nan
    assert not learner.train_step(pad)["skipped"]


def test_flat_params_round_trip_gives_the_learners_greedy_actions():
    rng = np.random.default_rng(5)
    learner = small_learner()
    batch, _ = play(rng, 16)
    for _ in range(5):
        learner.train_step(batch)
    policy = QMixPolicy(N, (S,), A, 16)
    policy.load_flat(learner.flat_params())
    assert learner.flat_params().dtype == np.float32 and len(learner.flat_params()) == policy.n_params
    # replay the batch's own actions through the policy and compare its Q with the learner's sequence pass
    policy.reset(16)
    b = learner._tensors(batch)
    with torch.no_grad():
        q_seq = learner._agent_q(learner.agent, b["inputs"]).numpy()
    for t in range(LIMIT):
        q = policy.q_values(batch["obs"][:, t])
        assert q.dtype == np.float32
        np.testing.assert_allclose(q, q_seq[:, t], rtol=1e-5, atol=1e-5)
        policy.chose(batch["actions"][:, t])
    # identical actions from two policies loaded with the same vector
    other = QMixPolicy(N, (S,), A, 16)
    other.load_flat(learner.flat_params())
    policy.reset(16)
    other.reset(16)
    for t in range(LIMIT):
        a1 = policy.act(batch["obs"][:, t], batch["avail"][:, t], 0.0, rng, greedy=True)
        a2 = other.act(batch["obs"][:, t], batch["avail"][:, t], 0.0, rng, greedy=True)
        assert np.array_equal(a1, a2)
    policy.reset_envs([0, 3])
    assert np.abs(policy.h[[0, 3]]).sum() == 0 and policy.last[[0, 3]].sum() == 0


@pytest.mark.parametrize("weights", ["none", "macpo"])
def test_state_dict_round_trip_gives_an_identical_step(weights):
    rng = np.random.default_rng(6)
    a = small_learner(weights, seed=0)
    batches = [play(rng, 8)[0] for _ in range(4)]
    for b in batches[:2]:
        a.train_step(b)
    b_ = small_learner(weights, seed=1)
    b_.load_state_dict(a.state_dict())
    assert b_.steps == a.steps == 2
    for batch in batches[2:]:
        sa, sb = a.train_step(batch), b_.train_step(batch)
        for k in ("loss", "td_abs", "q_tot", "central_loss", "grad_norm"):
            assert sa[k] == sb[k] or (np.isnan(sa[k]) and np.isnan(sb[k])), k
        np.testing.assert_array_equal(sa["episode_weights"], sb["episode_weights"])
    np.testing.assert_array_equal(a.flat_params(), b_.flat_params())


def test_target_copies_every_target_update_steps():
    rng = np.random.default_rng(7)
    hp = QmixHyper(rnn_hidden=16, mixer_embed=8, hypernet_hidden=16, target_update=3)
    learner = QMixLearner(N, (S,), (S,), A, hp)
    batch, _ = play(rng, 8)
    for step in range(1, 7):
        learner.train_step(batch)
        same = torch.equal(torch.nn.utils.parameters_to_vector(learner.target_agent.parameters()),
                           torch.nn.utils.parameters_to_vector(learner.agent.parameters()))
        assert same == (step % 3 == 0)


def test_agent_inputs_and_spec():
    spec = episode_spec(8, (5, 5, 3), np.uint8, (30,), np.float32, 5, 200)
    assert spec["obs"] == ((201, 8, 5, 5, 3), np.uint8) and spec["avail"] == ((201, 8, 5), np.bool_)
    assert spec["actions"][0] == (201, 8) and spec["reward"] == ((201,), np.float32)
    x = agent_inputs(torch.ones(2, 3, 4, dtype=torch.uint8), torch.zeros(2, 3, 5))
    assert x.shape == (2, 3, 4 + 5 + 3) and x.dtype == torch.float32
    assert torch.equal(x[1, :, -3:], torch.eye(3))
