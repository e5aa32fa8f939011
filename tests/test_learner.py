"""The learner's algorithm side without MPI: Ape-X's train step on a batch as the buffers send it."""

from __future__ import annotations

import numpy as np
import torch

from mpirl.agents.dqn import DQNLearner
from mpirl.bench.learner import _learner, _reply
from mpirl.replay.weights import importance_weights, linear_schedule
from mpirl.actor_learner.batch_sources import Batch
from mpirl.actor_learner.shard_links import joined

OBS = ((4,), np.float32)


def _steps(n: int = 3):
    """Ape-X's algorithm object trained ``n`` times on one seeded reply: the values it gives back, its parameters."""
    torch.manual_seed(0)
    views, fields, size = _reply(OBS, 2, capacity=512)
    probs = views["probs"]  # one buffer: drawn with its own probabilities
    algo = _learner(torch.device("cpu"), OBS, 2, [32, 32])
    algo.transferred(float(views["priority"].mean()))
    values = [algo.train(Batch(joined([views], fields), views["priority"], probs, size)) for _ in range(n)]
    return views, fields, size, probs, algo, values


def test_apex_train_step_is_deterministic_and_is_the_agents_step_with_importance_weights():
    views, fields, size, probs, algo, values = _steps()
    again = _steps()
    for a, b in zip(values, again[5]):
        assert np.array_equal(a, b)
    assert np.array_equal(algo.flat_params(), again[4].flat_params())
    # The same steps by hand: the agent's own step with the weights of the beta schedule.
    cfg = algo.cfg
    agent = DQNLearner(OBS[0], 2, cfg.agent, torch.device("cpu"), seed=cfg.run.seed)
    for k, expected in enumerate(values):
        beta = linear_schedule(cfg.replay.beta, cfg.replay.beta_final, k, cfg.replay.beta_steps)
        _, td = agent.train_step({name: views[name] for name in fields}, importance_weights(probs, size, beta))
        assert np.array_equal(td, expected)
    assert algo.steps == 3 and np.array_equal(agent.flat_params(), algo.flat_params())


def test_apex_declares_its_metric_columns_and_its_state_round_trips():
    _, _, _, _, algo, values = _steps(2)
    stats, timers = algo.columns()
    assert list(stats) == ["loss", "p_s", "p_t", "td_abs"] and timers == {}
    st = algo.state()
    assert set(st) == {"online", "target", "optimizer"}
    other = _learner(torch.device("cpu"), OBS, 2, [32, 32])
    other.restore({**st, "train_steps": algo.steps})
    assert other.steps == 2 and np.array_equal(other.flat_params(), algo.flat_params())
