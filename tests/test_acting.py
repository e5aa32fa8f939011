"""An Ape-X actor's network: the dueling MLP computed in numpy is the torch network's, to float32 rounding, from the
same broadcast vector, and an actor on vector observations never imports torch."""

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mpirl.agents.acting import MLPActing, acting_policy
from mpirl.agents.dqn import ActingPolicy, td_errors, transition_spec
from mpirl.agents.networks import build_network, parameter_count
from mpirl.agents.tensors import to_tensors

# Each case: observation shape and dtype, actions, hidden widths (the MLP on vectors, and flattened images).
CASES = [((4,), np.float32, 2, [256, 256]), ((8,), np.float64, 5, [64]), ((11,), np.float32, 3, [32, 16, 8]),
         ((2, 5, 5), np.uint8, 4, [64, 32])]


def torch_and_numpy(obs_shape, n_actions, hidden, seed=0):
    torch.manual_seed(seed)
    net = build_network(obs_shape, n_actions, hidden, "mlp")
    with torch.no_grad():  # parameters well away from zero: every unit's sign is decided
        for p in net.parameters():
            p.mul_(3.0)
    flat = torch.nn.utils.parameters_to_vector(net.parameters()).detach().numpy().astype(np.float32)
    ours = MLPActing(obs_shape, n_actions, hidden)
    ours.load_flat(flat)
    return net, ours


def observations(rng, obs_shape, dtype, n):
    if dtype == np.uint8:
        return rng.integers(0, 256, size=(n, *obs_shape), dtype=np.uint8)
    return rng.standard_normal((n, *obs_shape)).astype(dtype)


@pytest.mark.numerical
@pytest.mark.parametrize("obs_shape,dtype,n_actions,hidden", CASES)
def test_the_numpy_mlp_computes_the_torch_networks_q_values_and_priorities(obs_shape, dtype, n_actions, hidden):
    net, ours = torch_and_numpy(obs_shape, n_actions, hidden)
    assert ours.n_params == parameter_count(net)
    rng = np.random.default_rng(1)
    obs = observations(rng, obs_shape, dtype, 64)
    with torch.no_grad():
        expected = net(torch.as_tensor(obs)).numpy()
    got = ours.q_values(obs)
    assert got.dtype == np.float32 and got.shape == (64, n_actions)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * scale)
    # The greedy action is torch's wherever the best two differ by more than rounding.
    top2 = np.sort(expected, axis=1)[:, -2:]
    decided = top2[:, 1] - top2[:, 0] > 1e-4 * scale
    assert decided.sum() > 48
    np.testing.assert_array_equal(ours.greedy(obs)[decided], expected.argmax(1)[decided])
    # Priorities: the double-DQN n-step |TD| with the one network as online and target.
    batch = {"obs": obs, "action": rng.integers(0, n_actions, 64), "reward": rng.standard_normal(64).astype(np.float32),
             "next_obs": observations(rng, obs_shape, dtype, 64), "done": rng.random(64) < 0.3,
             "discount": np.full(64, 0.99 ** 3, np.float32)}
    want = td_errors(net, net, to_tensors(batch, torch.device("cpu"))).numpy()
    prio = ours.priorities(batch)
    assert prio.dtype == np.float32 and prio.shape == (64,)
    # A different argmax at a near tie changes the bootstrap by at most the tie's gap: within rounding too.
    np.testing.assert_allclose(prio, want, rtol=0, atol=1e-4 * scale)


def test_a_wrong_length_broadcast_is_refused():
    ours = MLPActing((4,), 2, [8])
    with pytest.raises(ValueError, match="parameters for a network of"):
        ours.load_flat(np.zeros(ours.n_params + 1, np.float32))


def test_the_policy_is_numpy_for_the_mlp_and_torch_for_the_convolutions():
    agent = SimpleNamespace(network="auto", hidden=[64, 64])
    assert isinstance(acting_policy((4,), 2, agent), MLPActing)
    assert isinstance(acting_policy((4, 10, 10), 3, agent), ActingPolicy)  # MinAtar's convolution
    agent.network = "mlp"
    assert isinstance(acting_policy((4, 10, 10), 3, agent), MLPActing)  # flattened, as FlatMLP


def test_an_actor_on_vector_observations_plays_and_prices_without_torch(tmp_path):
    # The modules an actor rank imports (the wiring, Ape-X's algorithm and its actor loop), then its games and
    # decisions on CartPole for 200 steps, priorities included: torch is never imported.
    # The spec comes from rank 0's checks (mpirl.agents.dqn.transition_spec, beside the torch learner): written out,
    # and held to it here.
    spec = ('{"obs": ((4,), np.dtype(np.float32)), "action": ((), np.dtype(np.int64)), '
            '"reward": ((), np.dtype(np.float32)), "next_obs": ((4,), np.dtype(np.float32)), '
            '"done": ((), np.dtype(np.bool_)), "discount": ((), np.dtype(np.float32))}')
    assert eval(spec) == transition_spec((4,), np.float32)
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import mpirl.job.wiring, mpirl.algos.apex.algorithm, mpirl.actor_learner.actor
        from mpirl import config
        from mpirl.algos.apex.algorithm import Spaces
        from mpirl.algos.apex.serving import ApexDeciding, ApexGames
        from mpirl.actor_learner.actor import Acting
        cfg, _ = config.load("jobs/cartpole.toml", [])
        spaces = Spaces((4,), np.dtype(np.float32), 2)
        spec = SPEC
        a = Acting(ApexGames(cfg, spaces, 3, "actor 0"), ApexDeciding(cfg, spaces, spec, [3], [0], 1))
        a.policy.load_flat((np.random.default_rng(0).standard_normal(a.policy.n_params) * 0.1).astype(np.float32))
        a.start()
        priced = 0
        for _ in range(200):
            a.step()
            if a.staged >= cfg.comm.send_batch:  # as the actor ships: a batch, priced, then dropped
                records, priorities = a.take(cfg.comm.send_batch)
                assert np.isfinite(priorities).all() and (priorities >= 0).all() and priorities.max() > 0
                a.drop(cfg.comm.send_batch)
                priced += len(priorities)
        assert priced > 100, priced
        a.close()
        print("torch" in sys.modules, type(a.policy).__name__)
        """)
    code = code.replace("SPEC", spec)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "MLPActing"], proc.stdout


def test_a_rank_runs_numpys_products_on_one_thread_unless_the_user_chose():
    code = ("from mpirl.job.blas_threads import one_blas_thread; set_now = one_blas_thread(); import numpy, os; "
            "print(set_now, os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "1", "1"]  # one thread in the whole process: OpenBLAS started none
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OPENBLAS_NUM_THREADS": "2"}, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split()[:2] == ["False", "2"], out.stderr  # the user's choice stands
