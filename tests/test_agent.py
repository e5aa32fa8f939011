"""DQN pieces: Ape-X epsilons, double-DQN n-step targets, a train step that learns."""

import re

import numpy as np
import pytest
import torch

from mpirl.agents.dqn import ActingPolicy, DQNLearner, n_step_target, td_errors, to_tensors
from mpirl.agents.exploration import apex_epsilon, env_epsilons
from mpirl.config import AgentConfig

pytestmark = pytest.mark.numerical  # float results held under each of MKL's kernel branches: test_cpu_kernels.py


def test_apex_epsilons():
    eps = [apex_epsilon(i, 8) for i in range(8)]
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert all(a > b for a, b in zip(eps, eps[1:]))
    assert apex_epsilon(0, 1) == 0.4


class Fixed(torch.nn.Module):
    """Q(s) read off the observation itself: obs = [q0, q1]."""

    def forward(self, obs):
        return obs.float()


def test_double_dqn_target_uses_online_argmax_and_target_values():
    online, target = Fixed(), lambda obs: obs.float() * 10
    b = to_tensors({"obs": np.array([[1.0, 2.0], [0.0, 0.0]], np.float32),
                    "next_obs": np.array([[3.0, 1.0], [1.0, 5.0]], np.float32),
                    "action": np.array([1, 0]), "reward": np.array([1.0, 2.0], np.float32),
                    "done": np.array([False, True]), "discount": np.array([0.5, 0.5], np.float32)}, torch.device("cpu"))
    y = n_step_target(online, target, b)
    # row 0: online argmax of next = 0 -> target value 30 -> 1 + 0.5 * 30; row 1: terminal -> reward only
    assert y.tolist() == [16.0, 2.0]
    assert td_errors(online, target, b).tolist() == [14.0, 2.0]


def test_train_step_fits_a_fixed_batch_and_returns_td():
    rng = np.random.default_rng(0)
    cfg = AgentConfig(lr=1e-2, target_update=1000)
    learner = DQNLearner((4,), 2, cfg, torch.device("cpu"))
    n = 64
    batch = {"obs": rng.standard_normal((n, 4)).astype(np.float32), "action": rng.integers(0, 2, n),
             "reward": rng.standard_normal(n).astype(np.float32), "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
             "done": np.ones(n, bool), "discount": np.full(n, 0.97, np.float32)}
    w = np.ones(n, np.float32)
    first, td = learner.train_step(batch, w)
    assert td.shape == (n,) and (td >= 0).all()
    for _ in range(300):
        last, _ = learner.train_step(batch, w)
    assert last < 0.2 * first
    assert learner.steps == 301


def test_acting_policy_loads_broadcast_params():
    cfg = AgentConfig()
    learner = DQNLearner((4,), 2, cfg, torch.device("cpu"), seed=1)
    policy = ActingPolicy((4,), 2, cfg)
    flat = learner.flat_params()
    assert flat.dtype == np.float32 and flat.size == policy.n_params == learner.n_params
    policy.load_flat(flat.copy())
    obs = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    with torch.no_grad():
        expected = learner.online(torch.from_numpy(obs)).argmax(1).numpy()
    np.testing.assert_array_equal(policy.act(obs, 0.0, np.random.default_rng(0)), expected)
    assert (policy.act(obs, 1.0, np.random.default_rng(0)) >= 0).all()


def test_nature_cnn_on_frame_stacks():
    from mpirl.agents.networks import NatureCNN, build_network

    net = build_network((4, 84, 84), 4, [512])
    assert isinstance(net, NatureCNN)
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    q = net(frames)
    assert q.shape == (3, 4) and q.dtype == torch.float32
    n_params = sum(p.numel() for p in net.parameters())
    assert 3.1e6 < n_params < 3.4e6  # Nature DQN torso + 512-wide dueling streams: 3,292,837
    # Pixels are scaled inside: uint8 frames give the Q of their values / 255.
    torch.testing.assert_close(net(frames.float() / 255.0), q)


def _rows_orthogonal(weight: torch.Tensor, gain: float) -> None:
    """``weight`` (out, in...) has orthogonal rows of norm ``gain`` (or columns, where out > in)."""
    w = weight.detach().flatten(1)
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    torch.testing.assert_close(gram, gain ** 2 * torch.eye(len(gram)), atol=1e-5 * max(1.0, gain ** 2), rtol=0)


def test_orthogonal_weight_init_is_the_references_and_keeps_the_nature_features_from_vanishing():
    from mpirl.agents.actor_critic import actor_critic
    from mpirl.agents.networks import image_floats
    cfg = AgentConfig()
    cfg.hidden, cfg.network = [512], "nature"
    torch.manual_seed(0)
    plain = actor_critic((4, 84, 84), 6, cfg)
    cfg.weight_init = "orthogonal"
    net = actor_critic((4, 84, 84), 6, cfg)
    layers = [m for m in [*net.torso.modules(), *net.shared.modules()]
              if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert len(layers) == 4  # three convolutions and the shared layer
    for layer in layers:
        _rows_orthogonal(layer.weight, 2 ** 0.5)
    _rows_orthogonal(net.policy.weight, 0.01)
    _rows_orthogonal(net.value.weight, 1.0)
    assert all(not m.bias.any() for m in [*layers, net.policy, net.value])
    # What the setting is for: PyTorch's defaults shrink each layer's output, so the features the heads read are
    # far smaller than the orthogonal start's (about 30x on Pong's stacks).
    frames = torch.randint(0, 256, (64, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        rms = [m.shared(m.torso(image_floats(frames))).square().mean().sqrt().item() for m in (plain, net)]
    assert rms[1] > 10 * rms[0], rms
    # A recurrent core and a Gaussian policy: the core's weights orthogonal with gain 1, the means' head 0.01.
    from mpirl.envs.actions import action_spec
    import gymnasium as gym
    cfg = AgentConfig()
    cfg.hidden, cfg.recurrent, cfg.weight_init = [16], "lstm", "orthogonal"
    net = actor_critic((3,), action_spec(gym.spaces.Box(-1, 1, (2,)), "x"), cfg)
    _rows_orthogonal(net.core.weight_ih, 1.0)
    _rows_orthogonal(net.core.weight_hh, 1.0)
    assert not net.core.bias_ih.any() and not net.core.bias_hh.any()
    _rows_orthogonal(net.policy.weight, 0.01)


def test_a_training_pass_of_the_nature_cnn_is_the_same_in_the_layout_it_is_given():
    """A pass with autograd on the CPU takes its input channels-last (nature_floats: faster backward
    convolutions); its values and every weight's gradient are those of the stored layout."""
    from mpirl.agents.actor_critic import ActorCritic
    from mpirl.agents.networks import image_floats, nature_floats

    frames = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)
    assert nature_floats(frames).is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        assert nature_floats(frames).is_contiguous()  # acting keeps the stored layout
    torch.testing.assert_close(nature_floats(frames), image_floats(frames))
    net = ActorCritic((4, 84, 84), 6, [512], "nature")
    grads = []
    for to_floats in (nature_floats, image_floats):
        net.zero_grad(set_to_none=True)
        x = to_floats(frames)
        out = net.policy(net.shared(net.torso(x)))
        out.square().mean().backward()
        grads.append([p.grad.clone() for p in (*net.torso.parameters(), *net.shared.parameters())])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    logits, values = net(frames)  # the network's own forward, with autograd: the same outputs as acting's
    assert logits.shape == (6, 6) and values.shape == (6,)
    with torch.no_grad():
        torch.testing.assert_close(net(frames)[0], logits.detach(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shape, choice, kind", [
    ((4,), "auto", "DuelingMLP"), ((4, 10, 10), "auto", "MinAtarCNN"), ((10, 10, 10), "auto", "MinAtarCNN"),
    ((4, 84, 84), "auto", "NatureCNN"), ((3, 35, 40), "auto", "MinAtarCNN"), ((3, 36, 36), "auto", "NatureCNN"),
    ((4, 10, 10), "mlp", "FlatMLP"), ((4, 84, 84), "minatar", "MinAtarCNN"), ((8, 8), "mlp", "FlatMLP")])
def test_the_network_is_chosen_from_the_observation_and_can_be_named(shape, choice, kind):
    from mpirl.agents.networks import build_network
    net = build_network(shape, 3, [32, 128], choice)
    assert type(net).__name__ == kind
    assert net(torch.zeros((2, *shape))).shape == (2, 3)


@pytest.mark.parametrize("shape, choice, words", [
    ((4, 10, 10), "nature", "36x36"), ((4,), "minatar", "(C, H, W) images"), ((2, 2, 2), "minatar", "3x3"),
    ((8, 8), "auto", "flattens any shape"), ((1, 2, 3, 4), "auto", "flattens any shape")])
def test_a_shape_the_network_cannot_take_is_a_value_error_saying_why(shape, choice, words):
    from mpirl.agents.networks import build_network
    with pytest.raises(ValueError, match=re.escape(words)):
        build_network(shape, 3, [32], choice)


def test_minatar_network_is_the_papers_with_a_dueling_head_and_reads_boolean_planes():
    from mpirl.agents.networks import MinAtarCNN, build_network
    net = build_network((4, 10, 10), 3, [128])
    assert isinstance(net, MinAtarCNN)
    conv = net.torso[0]
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride) == (4, 16, (3, 3), (1, 1))
    assert sum(p.numel() for p in net.parameters()) == 263_508  # 592 conv + 2 x (1024 x 128 + 128) + 129 + 387
    planes = torch.rand(5, 4, 10, 10) < 0.2
    torch.testing.assert_close(net(planes), net(planes.float()))  # bool planes are 0/1, not pixels


def test_bf16_autocast_trains_in_float32_state():
    from types import SimpleNamespace

    import torch

    from mpirl.agents.dqn import DQNLearner
    cfg = SimpleNamespace(hidden=[32], lr=1e-3, adam_eps=1e-8, grad_clip=10.0, target_update=100, precision="bf16",
                          network="auto")
    agent = DQNLearner((4,), 2, cfg, torch.device("cpu"))
    rng = np.random.default_rng(0)
    batch = {"obs": rng.normal(size=(64, 4)).astype(np.float32), "action": rng.integers(0, 2, 64),
             "reward": np.ones(64, np.float32), "next_obs": rng.normal(size=(64, 4)).astype(np.float32),
             "done": np.ones(64, bool), "discount": np.full(64, 0.99, np.float32)}
    losses = [agent.train_step(batch, np.ones(64, np.float32))[0] for _ in range(200)]
    assert all(np.isfinite(losses)) and losses[-1] < 0.1 * losses[0]  # regresses onto r = 1
    assert all(p.dtype == torch.float32 for p in agent.online.parameters())


def test_each_game_of_an_actor_is_one_apex_actor():
    # 2 actors x 4 games = the 8 epsilons of Ape-X with N = 8, in order.
    eps = np.concatenate([env_epsilons(i, 2, 4) for i in range(2)])
    np.testing.assert_allclose(eps, [apex_epsilon(i, 8) for i in range(8)])
    np.testing.assert_allclose(env_epsilons(1, 3, 1), [apex_epsilon(1, 3)])  # one game each: unchanged
