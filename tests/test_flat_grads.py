"""A network's gradient (and parameters) as one flat float32 vector: round trips, a missing gradient, dtypes,
lengths."""

import numpy as np
import pytest
import torch

from mpirl.agents.actor_critic import ActorCritic
from mpirl.agents.flat_grads import clip_scale, flat_grad, flat_norm, flat_values, set_flat_grad, wire_dtype
from mpirl.agents.optimizers import adam, rmsprop
from mpirl.agents.policy_gradient import a2c_losses

pytestmark = pytest.mark.numerical  # float results held under each of MKL's kernel branches: test_cpu_kernels.py

def test_flat_grad_round_trip_on_an_actor_critic():
    torch.manual_seed(0)
    net = ActorCritic((4,), 2, [16, 16])
    obs, actions = torch.randn(8, 4), torch.randint(2, (8,))
    a2c_losses(net, obs, actions, torch.randn(8), torch.randn(8), 0.5, 0.01).total.backward()
    params = list(net.parameters())
    n = sum(p.numel() for p in params)
    flat = np.full(n, np.nan, np.float32)
    flat_grad(net.parameters(), flat)
    np.testing.assert_array_equal(flat, torch.cat([p.grad.reshape(-1) for p in params]).numpy())

    other = ActorCritic((4,), 2, [16, 16])
    set_flat_grad(other.parameters(), flat)
    for p, q in zip(params, other.parameters()):
        assert q.grad is not None and q.grad.dtype == q.dtype and q.grad.shape == q.shape
        assert torch.equal(p.grad, q.grad)
    flat[:] = 0.0  # the gradients are copies
    assert torch.equal(params[0].grad, next(other.parameters()).grad)
    set_flat_grad(other.parameters(), np.arange(n, dtype=np.float32))  # over existing gradients
    back = np.empty(n, np.float32)
    flat_grad(other.parameters(), back)
    np.testing.assert_array_equal(back, np.arange(n, dtype=np.float32))


def test_flat_grad_zeros_a_missing_gradient_and_converts_dtype():
    net = ActorCritic((4,), 2, [16, 16]).double()
    params = list(net.parameters())
    params[0].grad = torch.full_like(params[0], 0.5)
    n = sum(p.numel() for p in params)
    out = np.full(n, np.nan, np.float32)
    flat_grad(params, out)
    k = params[0].numel()
    assert (out[:k] == 0.5).all() and (out[k:] == 0.0).all()
    set_flat_grad(params, out)
    assert all(p.grad is not None and p.grad.dtype == torch.float64 for p in params)
    assert float(params[1].grad.abs().sum()) == 0.0 and float(params[0].grad.mean()) == 0.5


def test_flat_grad_length_mismatch_names_both_lengths():
    net = ActorCritic((4,), 2, [16, 16])
    n = sum(p.numel() for p in net.parameters())
    with pytest.raises(ValueError, match=rf"{n}.*{n + 1}"):
        flat_grad(net.parameters(), np.zeros(n + 1, np.float32))
    with pytest.raises(ValueError, match=rf"{n}.*{n - 1}"):
        set_flat_grad(net.parameters(), np.zeros(n - 1, np.float32))
    with pytest.raises(ValueError, match="float32"):
        flat_grad(net.parameters(), np.zeros(n, np.float16))


def test_a_network_in_float64_sums_its_gradient_in_float64():
    """The learners' gradient sum follows their parameters' dtype (float64 in tests/learners_job.py's exact check):
    a float64 vector holds each float64 gradient exactly, and set back it is the same tensor."""
    torch.manual_seed(0)
    net = ActorCritic((4,), 2, [16, 16]).double()
    a2c_losses(net, torch.randn(8, 4, dtype=torch.float64), torch.randint(2, (8,)), torch.randn(8, dtype=torch.float64),
               torch.randn(8, dtype=torch.float64), 0.5, 0.01).total.backward()
    params = list(net.parameters())
    assert wire_dtype(params) == np.float64 and wire_dtype(ActorCritic((4,), 2, [8]).parameters()) == np.float32
    flat = np.zeros(sum(p.numel() for p in params), wire_dtype(params))
    flat_grad(params, flat)
    want = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
    np.testing.assert_array_equal(flat, want)
    set_flat_grad(params, flat * 2)
    np.testing.assert_array_equal(torch.cat([p.grad.reshape(-1) for p in params]).numpy(), want * 2)


def test_flat_values_write_the_parameters_in_place_as_parameters_to_vector_does():
    net = ActorCritic((4,), 2, [16, 16]).double()
    n = sum(p.numel() for p in net.parameters())
    out = np.full(n, np.nan, np.float32)
    flat_values(net.parameters(), out)
    np.testing.assert_array_equal(out, torch.nn.utils.parameters_to_vector(net.parameters()).float().detach().numpy())
    with pytest.raises(ValueError, match=rf"the parameters have {n} values but out has {n + 1}"):
        flat_values(net.parameters(), np.zeros(n + 1, np.float32))


@pytest.mark.parametrize("max_norm", [0.05, 1e6])
def test_clipping_the_flat_vector_equals_clip_grad_norm(max_norm):
    """A3cModel.apply clips the flat gradient in the copy into the parameters: the same gradients, up to rounding,
    as torch's ``clip_grad_norm_`` on the parameters, and the same norm before clipping."""
    torch.manual_seed(1)
    net = ActorCritic((4,), 2, [16, 16])
    obs, actions = torch.randn(8, 4), torch.randint(2, (8,))
    a2c_losses(net, obs, actions, torch.randn(8), torch.randn(8), 0.5, 0.01).total.backward()
    params = list(net.parameters())
    flat = np.empty(sum(p.numel() for p in params), np.float32)
    flat_grad(params, flat)
    theirs = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    norm = flat_norm(flat)
    assert norm == pytest.approx(theirs, rel=1e-5)
    other = ActorCritic((4,), 2, [16, 16])
    set_flat_grad(other.parameters(), flat, clip_scale(norm, max_norm))
    for p, q in zip(params, other.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-8)
    clipped = np.concatenate([q.grad.reshape(-1).numpy() for q in other.parameters()])
    assert flat_norm(clipped) == pytest.approx(min(norm, max_norm), rel=1e-5)


def test_a_non_finite_norm_leaves_a_non_finite_gradient_as_torch_does():
    flat = np.array([1.0, np.inf, 2.0], np.float32)
    assert flat_norm(flat) == np.inf and np.isnan(clip_scale(flat_norm(flat), 1.0))
    assert np.isnan(flat_norm(np.array([np.nan], np.float32)))
    assert flat_norm(np.zeros(0, np.float32)) == 0.0 and clip_scale(0.0, 1.0) == 1.0


def test_the_fused_adam_steps_as_the_loop_does_and_rmsprop_as_torchs():
    """The optimizers the learners build: Adam with torch's fused kernel on the CPU, equal to the per-parameter loop
    up to rounding over many steps; RMSProp with ``foreach``."""
    torch.manual_seed(2)
    nets = [ActorCritic((4,), 3, [32, 32]) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    ours = adam(nets[0].parameters(), 1e-3, 1e-5)
    assert ours.defaults["fused"]
    loop = torch.optim.Adam(nets[1].parameters(), lr=1e-3, eps=1e-5, foreach=False)
    for _ in range(50):
        g = [torch.randn_like(p) for p in nets[0].parameters()]
        for net, opt in zip(nets, (ours, loop)):
            for p, gi in zip(net.parameters(), g):
                p.grad = gi.clone()
            opt.step()
    for p, q in zip(*(n.parameters() for n in nets)):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert rmsprop(nets[0].parameters(), 1e-3, 0.99, 0.1).defaults["foreach"]


def test_the_learners_optimizers_take_torchs_steps_without_importing_dynamo():
    """mpirl.agents.optimizers' Adam and RMSprop are torch's, their steps bit for bit the same as torch.optim's over
    20 steps (fused Adam too, against torch's fused), and a learner that trains with them (DQN, QMIX, the
XX, whose import cost every training rank
    2 CPU-s of its start-up: in a process of its own, as a rank is."""
    code = """
import sys, torch
from types import SimpleNamespace
from mpirl.agents import optimizers as o
from mpirl.agents.dqn import DQNLearner
from mpirl.agents.actor_critic import ActorCritic
from mpirl.agents.policy_gradient import a2c_losses
import numpy as np
agent = SimpleNamespace(hidden=[16], network="mlp", lr=1e-3, adam_eps=1e-8, grad_clip=10.0, target_update=5,
                        precision="fp32", gamma=0.99)
dqn = DQNLearner((4,), 2, agent, torch.device("cpu"), seed=1)
rng = np.random.default_rng(0)
batch = {"obs": rng.standard_normal((8, 4)).astype(np.float32), "next_obs": rng.standard_normal((8, 4)).astype(np.float32),
         "action": rng.integers(0, 2, 8), "reward": rng.standard_normal(8).astype(np.float32),
         "discount": np.full(8, 0.97, np.float32), "done": np.zeros(8, bool)}
for _ in range(3):
    dqn.train_step(batch, np.ones(8, np.float32))
dqn.optimizer.load_state_dict(dqn.optimizer.state_dict())
net = ActorCritic((4,), 2, [16])
for opt in (o.adam(net.parameters(), 1e-3, 1e-8), o.rmsprop(net.parameters(), 1e-3, 0.99, 1e-5)):
    a2c_losses(net, torch.randn(8, 4), torch.randint(2, (8,)), torch.randn(8), torch.randn(8), 0.5, 0.01).total.backward()
    opt.step(); opt.zero_grad()
print("dynamo" if "torch._dynamo" in sys.modules else "no dynamo")
for ours, theirs, kw in ((o.Adam, torch.optim.Adam, {}), (o.Adam, torch.optim.Adam, {"fused": True}),
                         (o.RMSprop, torch.optim.RMSprop, {"foreach": True})):
    torch.manual_seed(0)
    a, b = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    oa, ob = ours(a.parameters(), lr=1e-2, **kw), theirs(b.parameters(), lr=1e-2, **kw)
    for _ in range(20):
        x = torch.randn(7, 5)
        for n, opt in ((a, oa), (b, ob)):
            opt.zero_grad()
            (n(x) ** 2).sum().backward()
            opt.step()
    print(theirs.__name__, kw, all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters())))
"""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "no dynamo", out.stdout
    assert lines[1:] == ["Adam {} True", "Adam {'fused': True} True", "RMSprop {'foreach': True} True"], out.stdout
