"""V-trace and the IMPALA loss: against references written here with plain loops (the paper's sums, not the code's
recursion), the on-policy case against n-step returns, episode ends inside a trajectory, and the loss's gradient
against finite differences on a tiny network."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mpirl.agents.actor_critic import ActorCritic, ImpalaLearner, impala_losses, trajectory_spec
from mpirl.agents.vtrace import vtrace

pytestmark = pytest.mark.numerical  # float results held under each of MKL's kernel branches: test_cpu_kernels.py


def reference(mu_logp, pi_logp, rewards, values, bootstrap, terminated, truncated, final_values, gamma, rho_bar,
              c_bar, lam):
    """v_s = V(x_s) + sum_{t=s}^{end} (prod_{i=s}^{t-1} gamma c_i) delta_t (Espeholt et al. 2018, eq. 1), one
    trajectory at a time in Python floats, where the sum ends at the episode's end or the trajectory's; and
    A_s = rho_s (r_s + gamma v_{s+1} - V(x_s)) with v_{s+1} the next state's target or its bootstrap."""
    B, T = len(rewards), len(rewards[0])
    vs, adv = np.zeros((B, T)), np.zeros((B, T))
    for b in range(B):
        ratio = [math.exp(pi_logp[b][t] - mu_logp[b][t]) for t in range(T)]

        def next_value(t):  # V(x_{t+1}) as step t bootstraps from it, and its discount
            if terminated[b][t]:
                return 0.0, 0.0
            if truncated[b][t]:
                return final_values[b][t], gamma
            return (values[b][t + 1] if t + 1 < T else bootstrap[b]), gamma

        def delta(t):
            nv, g = next_value(t)
            return min(rho_bar, ratio[t]) * (rewards[b][t] + g * nv - values[b][t])

        for s in range(T):
            total, weight, t = 0.0, 1.0, s
            while True:
                total += weight * delta(t)
                if terminated[b][t] or truncated[b][t] or t + 1 == T:
                    break
                weight *= gamma * lam * min(c_bar, ratio[t])
                t += 1
            vs[b][s] = values[b][s] + total
        for s in range(T):
            if terminated[b][s]:
                nv, g = 0.0, 0.0
            elif truncated[b][s]:
                nv, g = final_values[b][s], gamma
            else:
                nv, g = (vs[b][s + 1] if s + 1 < T else bootstrap[b]), gamma
            adv[b][s] = min(rho_bar, ratio[s]) * (rewards[b][s] + g * nv - values[b][s])
    return vs, adv


def random_batch(seed, B=5, T=9, ends=True):
    rng = np.random.default_rng(seed)
    d = {"mu": rng.normal(-1.0, 0.5, (B, T)), "pi": rng.normal(-1.0, 0.5, (B, T)), "r": rng.normal(0, 1, (B, T)),
         "v": rng.normal(0, 1, (B, T)), "boot": rng.normal(0, 1, B), "final": rng.normal(0, 1, (B, T))}
    d["term"] = (rng.random((B, T)) < 0.15) if ends else np.zeros((B, T), bool)
    d["trunc"] = ((rng.random((B, T)) < 0.15) & ~d["term"]) if ends else np.zeros((B, T), bool)
    return d


def run_both(d, gamma, rho_bar, c_bar, lam):
    t = {k: torch.as_tensor(v) for k, v in d.items()}
    got = vtrace(t["mu"], t["pi"], t["r"], t["v"], t["boot"], t["term"], t["trunc"], t["final"], gamma, rho_bar,
                 c_bar, lam)
    want = reference(d["mu"], d["pi"], d["r"], d["v"], d["boot"], d["term"], d["trunc"], d["final"], gamma, rho_bar,
                     c_bar, lam)
    return got, want


@pytest.mark.parametrize("rho_bar,c_bar,lam", [(1.0, 1.0, 1.0), (0.5, 0.8, 0.95), (1e9, 1e9, 1.0), (2.0, 1.0, 0.5)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vtrace_matches_the_papers_sums_with_and_without_clipping(seed, rho_bar, c_bar, lam):
    d = random_batch(seed)
    got, (vs, adv) = run_both(d, 0.97, rho_bar, c_bar, lam)
    np.testing.assert_allclose(got.vs.numpy(), vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.advantages.numpy(), adv, rtol=1e-10, atol=1e-10)
    ratio = np.exp(d["pi"] - d["mu"])
    assert float(got.rho_clipped) == pytest.approx(float(np.mean(ratio > rho_bar * (1 + 1e-4))))


def test_on_policy_targets_are_n_step_returns_to_the_trajectorys_end():
    """Actions acted by the policy being learned: v_s = r_s + gamma r_{s+1} + ... + gamma^(T-s) V(x_T)."""
    d = random_batch(3, ends=False)
    d["pi"] = d["mu"].copy()
    got, _ = run_both(d, 0.9, 1.0, 1.0, 1.0)
    B, T = d["r"].shape
    for b in range(B):
        for s in range(T):
            ret = sum(0.9 ** (t - s) * d["r"][b][t] for t in range(s, T)) + 0.9 ** (T - s) * d["boot"][b]
            assert float(got.vs[b, s]) == pytest.approx(ret, rel=1e-10)
            nxt = float(got.vs[b, s + 1]) if s + 1 < T else d["boot"][b]
            assert float(got.advantages[b, s]) == pytest.approx(d["r"][b][s] + 0.9 * nxt - d["v"][b][s], rel=1e-10)


def test_a_trajectory_crossing_an_episode_end_bootstraps_a_truncation_and_not_a_termination():
    """One trajectory, on-policy, T=4: the episode ends after step 1. Terminated: v_1 = r_1, and v_0 sums r_0 and
    r_1 only. Truncated: v_1 = r_1 + gamma V(final), and nothing of steps 2-3 (the next episode) reaches v_0."""
    g = 0.5
    base = {"mu": np.zeros((1, 4)), "pi": np.zeros((1, 4)), "r": np.array([[1.0, 2.0, 4.0, 8.0]]),
            "v": np.array([[0.3, 0.7, 0.9, 1.1]]), "boot": np.array([10.0]), "final": np.array([[0.0, 6.0, 0.0, 0.0]]),
            "term": np.zeros((1, 4), bool), "trunc": np.zeros((1, 4), bool)}
    ended = dict(base, term=np.array([[False, True, False, False]]))
    got, _ = run_both(ended, g, 1.0, 1.0, 1.0)
    assert got.vs[0].tolist() == pytest.approx([1 + g * 2, 2, 4 + g * 8 + g * g * 10, 8 + g * 10])
    cut = dict(base, trunc=np.array([[False, True, False, False]]))
    got, _ = run_both(cut, g, 1.0, 1.0, 1.0)
    assert got.vs[0].tolist() == pytest.approx([1 + g * 2 + g * g * 6, 2 + g * 6, 4 + g * 8 + g * g * 10, 8 + g * 10])
    assert float(got.advantages[0, 1]) == pytest.approx(2 + g * 6 - 0.7)


def tiny_batch(rng, B=3, T=4, obs_dim=3, n_actions=2):
    spec = trajectory_spec((obs_dim,), np.float32, T)
    b = {k: np.zeros((B, *shape), dtype) for k, (shape, dtype) in spec.items()}
    b["obs"][:] = rng.normal(size=b["obs"].shape)
    b["action"][:] = rng.integers(n_actions, size=(B, T))
    b["reward"][:] = rng.normal(size=(B, T))
    b["logp"][:] = np.log(rng.uniform(0.2, 0.8, size=(B, T)))
    b["terminated"][0, 1] = True
    b["truncated"][1, 2] = True
    b["final_value"][1, 2] = 0.4
    return b


def test_the_loss_gradient_matches_finite_differences_on_a_tiny_network(monkeypatch):
    """The V-trace targets carry no gradient (the algorithm computes them without); with them held at their value
    at theta, the gradient autograd gives the policy, value and entropy terms matches central differences of the
    loss in float64."""
    from mpirl.agents import actor_critic
    torch.manual_seed(0)
    net = ActorCritic((3,), 2, [5]).double()
    b = {k: torch.as_tensor(v) for k, v in tiny_batch(np.random.default_rng(0)).items()}
    for k in ("obs", "logp", "reward", "final_value"):
        b[k] = b[k].double()
    theta = torch.nn.utils.parameters_to_vector(net.parameters()).detach().clone()

    def loss_at(params: torch.Tensor) -> torch.Tensor:
        torch.nn.utils.vector_to_parameters(params, net.parameters())
        return impala_losses(net, b, 0.9, 1.0, 1.0, 1.0, 0.5, 0.01).total

    net.zero_grad()
    loss_at(theta.clone()).backward()
    grad = torch.cat([p.grad.flatten() for p in net.parameters()])
    held = actor_critic.vtrace(*vtrace_inputs(net, b), 0.9, 1.0, 1.0, 1.0)
    monkeypatch.setattr(actor_critic, "vtrace", lambda *a, **k: held)
    eps = 1e-6
    for i in range(0, len(theta), max(1, len(theta) // 25)):
        up, down = theta.clone(), theta.clone()
        up[i] += eps
        down[i] -= eps
        with torch.no_grad():
            numeric = (loss_at(up) - loss_at(down)) / (2 * eps)
        assert float(grad[i]) == pytest.approx(float(numeric), rel=1e-5, abs=1e-8), i


@torch.no_grad()
def vtrace_inputs(net, b):
    B, T1 = b["obs"].shape[:2]
    logits, values = net(b["obs"].reshape(B * T1, -1))
    logits, values = logits.view(B, T1, -1)[:, :-1], values.view(B, T1)
    logp = torch.log_softmax(logits, -1).gather(2, b["action"].unsqueeze(-1)).squeeze(-1)
    return (b["logp"], logp, b["reward"], values[:, :-1], values[:, -1], b["terminated"], b["truncated"],
            b["final_value"])


def test_a_train_step_moves_the_policy_toward_the_rewarded_action():
    """A one-state bandit: action 1 pays 1, action 0 pays 0; a few steps raise pi(1)."""
    cfg = SimpleNamespace(hidden=[8], network="auto", gamma=0.9, lr=0.05, adam_eps=1e-8, grad_clip=40.0,
                          activation="relu", shared_torso=True, log_std_init=0.0, weight_init="torch",
                          normalize_obs=False, recurrent="none", normalize_reward=False, normalized_obs_clip=10.0,
                          normalized_reward_clip=10.0)
    icfg = SimpleNamespace(optimizer="adam", rmsprop_alpha=0.99, rmsprop_eps=0.01, rho_bar=1.0, c_bar=1.0, lam=1.0,
                           value_coef=0.5, entropy_coef=0.0)
    learner = ImpalaLearner((2,), 2, cfg, icfg, torch.device("cpu"))
    rng = np.random.default_rng(0)
    spec = trajectory_spec((2,), np.float32, 5)
    b = {k: np.zeros((16, *shape), dtype) for k, (shape, dtype) in spec.items()}
    b["obs"][:] = 1.0
    b["terminated"][:] = True  # every step an episode of its own
    before = torch.softmax(learner.net(torch.ones(1, 2))[0], -1)[0, 1].item()
    for _ in range(30):
        b["action"][:] = rng.integers(2, size=(16, 5))
        b["reward"][:] = b["action"]
        b["logp"][:] = math.log(0.5)
        stats = learner.train_step(b)
        assert stats is not None and all(math.isfinite(v) for v in stats.values())
    after = torch.softmax(learner.net(torch.ones(1, 2))[0], -1)[0, 1].item()
    assert after > max(before, 0.9)
    assert learner.steps == 30
