"""A2C / PPO's pure parts: generalized advantages against hand-computed rollouts and a plain-loop reference (episode
ends inside a rollout, lambda = 1 as n-step returns), the losses on a network whose logits and values are its
parameters (hand-computed values and gradients, the clipped branch giving no gradient) and minibatches (the flat
gradient: test_flat_grads.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from mpirl.agents.actor_critic import ActorCritic
from mpirl.agents.distributions import categorical_log_prob_entropy
from mpirl.agents.policy_gradient import PGLosses, a2c_losses, gae, minibatch_indices, ppo_losses

pytestmark = pytest.mark.numerical  # float results held under each of MKL's kernel branches: test_cpu_kernels.py

# ---------------------------------------------------------------------------------------------------------------- gae

# One game (E = 1), T = 3, gamma = 0.5: rewards 1, 2, 3; V(x_0..2) = 0.5, 1.0, 1.5; V(x_3) = 2.
REWARDS, VALUES, BOOT, G = [1.0, 2.0, 3.0], [0.5, 1.0, 1.5], 2.0, 0.5


def run_gae(rewards=REWARDS, values=VALUES, boot=BOOT, term=(False,) * 3, trunc=(False,) * 3, final=(0.0,) * 3,
            gamma=G, lam=1.0):
    """gae on one game given as lists over time; the advantages and returns as lists."""
    col = lambda x, dtype=torch.float64: torch.tensor(x, dtype=dtype)[:, None]  # noqa: E731
    adv, ret = gae(col(rewards), col(values), torch.tensor([boot], dtype=torch.float64), col(term, torch.bool),
                   col(trunc, torch.bool), col(final), gamma, lam)
    assert adv.shape == ret.shape == (len(rewards), 1)
    return adv[:, 0].tolist(), ret[:, 0].tolist()


def test_gae_lambda_one_by_hand():
    """delta_0 = 1 + .5*1.0 - .5 = 1, delta_1 = 2 + .5*1.5 - 1 = 1.75, delta_2 = 3 + .5*2 - 1.5 = 2.5.
    lambda = 1: A_2 = 2.5, A_1 = 1.75 + .5*2.5 = 3, A_0 = 1 + .5*3 = 2.5; returns A + V = 3, 4, 4, which are the
    n-step returns: R_0 = 1 + .5*2 + .25*3 + .125*2 = 3, R_1 = 2 + .5*3 + .25*2 = 4, R_2 = 3 + .5*2 = 4."""
    adv, ret = run_gae(lam=1.0)
    assert adv == pytest.approx([2.5, 3.0, 2.5])
    assert ret == pytest.approx([3.0, 4.0, 4.0])


def test_gae_lambda_half_by_hand():
    """gamma lambda = .25: A_2 = 2.5, A_1 = 1.75 + .25*2.5 = 2.375, A_0 = 1 + .25*2.375 = 1.59375."""
    adv, ret = run_gae(lam=0.5)
    assert adv == pytest.approx([1.59375, 2.375, 2.5])
    assert ret == pytest.approx([2.09375, 3.375, 4.0])


def test_gae_lambda_zero_is_the_one_step_td_error():
    adv, _ = run_gae(lam=0.0)
    assert adv == pytest.approx([1.0, 1.75, 2.5])


def test_a_terminated_step_bootstraps_nothing_and_stops_the_chain():
    """Terminated after step 1: delta_1 = 2 - 1 = 1 (no V(x_2)); A_1 = 1 (no A_2); A_0 = 1 + .5*1 = 1.5, so R_0 =
    r_0 + .5 r_1 = 2. Step 2 (the next episode) is as before: A_2 = 2.5. final_values is not read (NaN there)."""
    nan = math.nan
    adv, ret = run_gae(term=(False, True, False), final=(nan, nan, nan))
    assert adv == pytest.approx([1.5, 1.0, 2.5])
    assert ret == pytest.approx([2.0, 2.0, 4.0])
    # terminated and truncated together is a termination
    adv2, _ = run_gae(term=(False, True, False), trunc=(False, True, False), final=(nan, 6.0, nan))
    assert adv2 == pytest.approx(adv)


def test_a_truncated_step_bootstraps_the_final_value_and_stops_the_chain():
    """Truncated after step 1 with V(final) = 6: delta_1 = 2 + .5*6 - 1 = 4, A_1 = 4 (nothing of step 2);
    A_0 = 1 + .5*4 = 3, so R_0 = 1 + .5*2 + .25*6 = 3.5. final_values elsewhere is not read (NaN)."""
    adv, ret = run_gae(trunc=(False, True, False), final=(math.nan, 6.0, math.nan))
    assert adv == pytest.approx([3.0, 4.0, 2.5])
    assert ret == pytest.approx([3.5, 5.0, 4.0])
    adv, _ = run_gae(trunc=(False, True, False), final=(math.nan, 6.0, math.nan), lam=0.5)
    assert adv == pytest.approx([1.0 + 0.25 * 4.0, 4.0, 2.5])


def reference_gae(r, v, boot, term, trunc, final, gamma, lam):
    """A_t = sum_{k=t}^{end} (gamma lambda)^(k-t) delta_k, one game at a time in Python floats, where the sum ends at
    the episode's end or the rollout's."""
    T, E = r.shape
    adv = np.zeros((T, E))
    for e in range(E):
        def delta(t):
            if term[t, e]:
                nv = 0.0
            elif trunc[t, e]:
                nv = final[t, e]
            else:
                nv = v[t + 1, e] if t + 1 < T else boot[e]
            return r[t, e] + gamma * nv - v[t, e]

        for s in range(T):
            total, t = 0.0, s
            while True:
                total += (gamma * lam) ** (t - s) * delta(t)
                if term[t, e] or trunc[t, e] or t + 1 == T:
                    break
                t += 1
            adv[s, e] = total
    return adv


def random_rollout(seed, T=9, E=4, ends=True):
    rng = np.random.default_rng(seed)
    d = {"r": rng.normal(size=(T, E)), "v": rng.normal(size=(T, E)), "boot": rng.normal(size=E),
         "final": rng.normal(size=(T, E))}
    d["term"] = (rng.random((T, E)) < 0.15) if ends else np.zeros((T, E), bool)
    d["trunc"] = (rng.random((T, E)) < 0.15) if ends else np.zeros((T, E), bool)  # may overlap term: term wins
    return d


@pytest.mark.parametrize("lam", [1.0, 0.95, 0.5, 0.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_the_sum_of_discounted_td_errors(seed, lam):
    d = random_rollout(seed)
    t = {k: torch.as_tensor(x) for k, x in d.items()}
    adv, ret = gae(t["r"], t["v"], t["boot"], t["term"], t["trunc"], t["final"], 0.97, lam)
    want = reference_gae(d["r"], d["v"], d["boot"], d["term"], d["trunc"] & ~d["term"], d["final"], 0.97, lam)
    np.testing.assert_allclose(adv.numpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), want + d["v"], rtol=1e-10, atol=1e-12)


def test_lambda_one_without_ends_gives_n_step_returns_to_the_rollouts_end():
    """R_s = r_s + gamma r_{s+1} + ... + gamma^(T-s) V(x_T) and A_s = R_s - V(x_s), every game of the rollout."""
    d = random_rollout(3, ends=False)
    t = {k: torch.as_tensor(x) for k, x in d.items()}
    adv, ret = gae(t["r"], t["v"], t["boot"], t["term"], t["trunc"], t["final"], 0.9, 1.0)
    T, E = d["r"].shape
    for e in range(E):
        for s in range(T):
            R = sum(0.9 ** (k - s) * d["r"][k, e] for k in range(s, T)) + 0.9 ** (T - s) * d["boot"][e]
            assert float(ret[s, e]) == pytest.approx(R, rel=1e-10)
            assert float(adv[s, e]) == pytest.approx(R - d["v"][s, e], rel=1e-10, abs=1e-12)


def test_gae_computes_in_the_dtype_of_values_without_gradient():
    d = random_rollout(4)
    v = torch.as_tensor(d["v"], dtype=torch.float32).requires_grad_()
    adv, ret = gae(torch.as_tensor(d["r"]), v, torch.as_tensor(d["boot"]), torch.as_tensor(d["term"]),
                   torch.as_tensor(d["trunc"]), torch.as_tensor(d["final"]), 0.99, 0.95)
    assert adv.dtype == ret.dtype == torch.float32
    assert not adv.requires_grad and not ret.requires_grad
    with pytest.raises(ValueError, match="bootstrap"):
        gae(v, v, v[0, :2], v > 0, v > 0, v, 0.99, 0.95)


# ------------------------------------------------------------------------------------------------------------ losses

class TableNet(nn.Module):
    """A "network" whose logits and values are its parameters: observation i (an integer) -> row i."""

    def __init__(self, logits, values):
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits, dtype=torch.float64))
        self.values = nn.Parameter(torch.tensor(values, dtype=torch.float64))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.logits[obs], self.values[obs]

    def log_prob_entropy(self, out: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return categorical_log_prob_entropy(out, (out.shape[-1],), actions)


# Two observations: pi(.|0) = (1/4, 3/4) (logits 0, ln 3), pi(.|1) = (1/2, 1/2); V = 1, 2.
LOG3 = math.log(3.0)


def tiny():
    return TableNet([[0.0, LOG3], [0.0, 0.0]], [1.0, 2.0]), torch.tensor([0, 1]), torch.tensor([1, 0])


def test_a2c_losses_by_hand():
    """actions 1, 0: log pi = ln .75, ln .5; A = 2, -1: policy = -(2 ln .75 - ln .5) / 2 = -ln(1.125) / 2.
    returns 3, 1 against V = 1, 2: value = .5 * (2^2 + 1^2) / 2 = 1.25. entropy = (H(1/4, 3/4) + ln 2) / 2."""
    net, obs, actions = tiny()
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64, requires_grad=True)
    out = a2c_losses(net, obs, actions, adv, torch.tensor([3.0, 1.0], dtype=torch.float64), 0.5, 0.01)
    assert isinstance(out, PGLosses)
    h0 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    entropy = (h0 + math.log(2.0)) / 2
    assert float(out.policy.detach()) == pytest.approx(-math.log(1.125) / 2)
    assert float(out.value.detach()) == pytest.approx(1.25)
    assert float(out.entropy.detach()) == pytest.approx(entropy)
    assert float(out.total.detach()) == pytest.approx(-math.log(1.125) / 2 + 0.5 * 1.25 - 0.01 * entropy)
    assert float(out.clip_fraction.detach()) == 0.0 and float(out.approx_kl.detach()) == 0.0
    out.policy.backward()
    # d(-A_i log pi(a_i|x_i) / N) / d logits_i = -A_i / N (onehot(a_i) - pi(.|x_i)); the advantages get nothing.
    pi = np.array([[0.25, 0.75], [0.5, 0.5]])
    onehot = np.array([[0.0, 1.0], [1.0, 0.0]])
    want = -np.array([2.0, -1.0])[:, None] / 2 * (onehot - pi)
    np.testing.assert_allclose(net.logits.grad.numpy(), want, atol=1e-12)
    assert adv.grad is None


def test_a2c_value_gradient_by_hand():
    net, obs, actions = tiny()
    out = a2c_losses(net, obs, actions, torch.zeros(2), torch.tensor([3.0, 1.0], dtype=torch.float64), 0.5, 0.0)
    out.total.backward()
    # d(.5 * .5 * mean((R - V)^2)) / dV_i = -.5 * (R_i - V_i) / N = -.5, .25
    np.testing.assert_allclose(net.values.grad.numpy(), [-0.5, 0.25], atol=1e-12)


def test_ppo_with_ratio_one_has_no_policy_loss_and_nothing_clipped():
    """old_logp = the current log pi: every ratio is 1, the surrogate is mean(normalised A) = 0; the value and
    entropy terms are A2C's."""
    net, obs, actions = tiny()
    with torch.no_grad():
        old = torch.log_softmax(net.logits, -1)[obs, actions]
    adv, ret = torch.tensor([2.0, -1.0], dtype=torch.float64), torch.tensor([3.0, 1.0], dtype=torch.float64)
    out = ppo_losses(net, obs, actions, old, adv, ret, 0.2, 0.5, 0.01)
    assert float(out.policy.detach()) == pytest.approx(0.0, abs=1e-12)
    assert float(out.clip_fraction.detach()) == 0.0
    assert float(out.approx_kl.detach()) == pytest.approx(0.0, abs=1e-12)
    a2c = a2c_losses(net, obs, actions, adv, ret, 0.5, 0.01)
    assert float(out.value.detach()) == pytest.approx(float(a2c.value.detach()))
    assert float(out.entropy.detach()) == pytest.approx(float(a2c.entropy.detach()))
    # not normalised, ratio 1: the surrogate is -mean(A) = -(2 - 1) / 2
    out = ppo_losses(net, obs, actions, old, adv, ret, 0.2, 0.5, 0.01, normalize=False)
    assert float(out.policy.detach()) == pytest.approx(-0.5)


# Four samples (observations 0, 1, 0, 1; actions 1, 0, 1, 0) whose ratios are set through old_logp, clip = .2:
#   ratio 1.5, A =  1: min(1.5, 1.2)     =  1.2  clipped branch, no gradient
#   ratio 0.9, A = -2: min(-1.8, -1.8)   = -1.8  inside the range, gradient
#   ratio 0.7, A = -1: min(-0.7, -0.8)   = -0.8  clipped branch, no gradient
#   ratio 1.5, A = -1: min(-1.5, -1.2)   = -1.5  outside the range but the unclipped branch is the min: gradient
# policy = -(1.2 - 1.8 - 0.8 - 1.5) / 4 = 0.725; clip fraction 3/4 (|ratio - 1| = .5, .1, .3, .5).
RATIOS, ADV = np.array([1.5, 0.9, 0.7, 1.5]), np.array([1.0, -2.0, -1.0, -1.0])


def clipped_case():
    net, _, _ = tiny()
    obs, actions = torch.tensor([0, 1, 0, 1]), torch.tensor([1, 0, 1, 0])
    logp = np.log(np.array([0.75, 0.5, 0.75, 0.5]))
    return net, obs, actions, torch.as_tensor(logp - np.log(RATIOS))


def test_ppo_clipped_surrogate_by_hand():
    net, obs, actions, old = clipped_case()
    out = ppo_losses(net, obs, actions, old, torch.as_tensor(ADV), torch.zeros(4, dtype=torch.float64), 0.2, 0.5,
                     0.0, normalize=False)
    assert float(out.policy.detach()) == pytest.approx(0.725)
    assert float(out.clip_fraction.detach()) == pytest.approx(0.75)
    assert float(out.approx_kl.detach()) == pytest.approx(float(np.mean((RATIOS - 1) - np.log(RATIOS))))
    assert not out.clip_fraction.requires_grad and not out.approx_kl.requires_grad


def test_ppo_clipped_branch_gives_no_gradient():
    """Each sample on its own row of logits: d(-rho A / N) / d logits = -A rho / N (onehot - pi) where the
    unclipped branch is the min, zero where the clipped one is."""
    logits = [[0.0, LOG3], [0.0, 0.0], [0.0, LOG3], [0.0, 0.0]]
    net = TableNet(logits, [0.0] * 4)
    obs, actions = torch.arange(4), torch.tensor([1, 0, 1, 0])
    _, _, _, old = clipped_case()
    out = ppo_losses(net, obs, actions, old, torch.as_tensor(ADV), torch.zeros(4, dtype=torch.float64), 0.2, 0.5,
                     0.0, normalize=False)
    out.policy.backward()
    grad = net.logits.grad.numpy()
    pi = np.array([[0.25, 0.75], [0.5, 0.5]] * 2)
    onehot = np.array([[0.0, 1.0], [1.0, 0.0]] * 2)
    want = -(ADV * RATIOS)[:, None] / 4 * (onehot - pi)
    want[[0, 2]] = 0.0
    np.testing.assert_allclose(grad, want, atol=1e-12)
    assert np.abs(grad[[1, 3]]).min() > 0.01


def test_ppo_normalises_the_advantages_per_minibatch():
    net, obs, actions, old = clipped_case()
    out = ppo_losses(net, obs, actions, old, torch.as_tensor(ADV), torch.zeros(4, dtype=torch.float64), 0.2, 0.5,
                     0.0)
    a = (ADV - ADV.mean()) / (ADV.std(ddof=1) + 1e-8)
    want = -np.mean(np.minimum(RATIOS * a, np.clip(RATIOS, 0.8, 1.2) * a))
    assert float(out.policy.detach()) == pytest.approx(want)
    # scaling and shifting the advantages changes nothing
    out2 = ppo_losses(net, obs, actions, old, torch.as_tensor(3 * ADV + 7), torch.zeros(4, dtype=torch.float64), 0.2,
                      0.5, 0.0)
    assert float(out2.policy.detach()) == pytest.approx(want)


def test_losses_on_an_actor_critic_are_finite_and_reach_every_parameter():
    torch.manual_seed(0)
    net = ActorCritic((4,), 2, [16, 16])
    obs, actions = torch.randn(6, 4), torch.tensor([0, 1, 1, 0, 1, 0])
    with torch.no_grad():
        old = torch.log_softmax(net(obs)[0], -1)[torch.arange(6), actions] + 0.1
    for out in (a2c_losses(net, obs, actions, torch.randn(6), torch.randn(6), 0.5, 0.01),
                ppo_losses(net, obs, actions, old, torch.randn(6), torch.randn(6), 0.2, 0.5, 0.01)):
        assert all(x.shape == () and torch.isfinite(x) for x in out)
        net.zero_grad(set_to_none=True)
        out.total.backward()
        assert all(p.grad is not None for p in net.parameters())


# -------------------------------------------------------------------------------------------------------- minibatches

@pytest.mark.parametrize("n,k,sizes", [(10, 3, [4, 3, 3]), (10, 4, [3, 3, 2, 2]), (7, 7, [1] * 7), (5, 1, [5]),
                                       (12, 4, [3] * 4)])
def test_minibatches_cover_every_index_once(n, k, sizes):
    parts = minibatch_indices(n, k, np.random.default_rng(0))
    assert [len(p) for p in parts] == sizes
    assert sorted(np.concatenate(parts).tolist()) == list(range(n))
    again = minibatch_indices(n, k, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_minibatches_are_shuffled_and_checked():
    parts = minibatch_indices(100, 2, np.random.default_rng(1))
    assert np.concatenate(parts).tolist() != list(range(100))
    for k in (0, -1, 11):
        with pytest.raises(ValueError):
            minibatch_indices(10, k, np.random.default_rng(0))
