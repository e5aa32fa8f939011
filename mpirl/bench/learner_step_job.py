"""One train step of K data-parallel DQN learners (``topology.learners``), timed under ``mpiexec -n K``; run by
``mpirl bench gradients`` (:func:`mpirl.bench.data_parallel.learner_step_rows`):

    mpiexec -n K python -m mpirl.bench.learner_step_job step OUT.json \\
        '{"batch": 256, "steps": 20, "reps": 3, "threads": 1}'

Each rank builds the Ape-X learner of the Nature CNN (4x84x84 uint8 frames, 4 actions) and trains its part of a
batch of ``batch`` random transitions (:func:`mpirl.replay.quotas.learner_quotas`) with
:class:`mpirl.actor_learner.learner_peers.LearnerPeers` on ``COMM_WORLD``: the control gather, the loss over its rows, the
gradient sum, the clipped Adam step, every rank on identical inputs. With K = 1 the same step with no peers (the
one-learner path). Train steps/s of the slowest rank, per repetition, from a barrier; ``threads`` torch threads per
rank (default 1), so that one learner with K threads and K learners of one thread each use the same cores.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import torch
from mpi4py import MPI

from mpirl.agents.dqn import DQNLearner
from mpirl.bench.mpi_entry import main as entry
from mpirl.replay.quotas import learner_quotas
from mpirl.replay.weights import importance_weights
from mpirl.actor_learner.learner_peers import LearnerPeers, smallest

AGENT = SimpleNamespace(hidden=[512], network="nature", lr=1e-4, adam_eps=1.5e-4, grad_clip=40.0, target_update=2500,
                        precision="fp32", gamma=0.99)
OBS, ACTIONS = (4, 84, 84), 4


def random_batch(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` random Ape-X transitions of the Nature CNN's frames (uint8 stacks) and actions."""
    return {"obs": rng.integers(0, 256, (n, *OBS), dtype=np.uint8),
            "next_obs": rng.integers(0, 256, (n, *OBS), dtype=np.uint8),
            "action": rng.integers(0, ACTIONS, n).astype(np.int64), "reward": rng.standard_normal(n).astype(np.float32),
            "discount": np.full(n, 0.97, np.float32), "done": np.zeros(n, bool)}


def measure(comm, batch: int, steps: int, reps: int, threads: int = 1) -> dict:
    torch.set_num_threads(threads)
    K, k = comm.size, comm.rank
    part = np.cumsum([0] + [sum(q) for q in learner_quotas([batch], K)])
    lo, hi = int(part[k]), int(part[k + 1])
    rng = np.random.default_rng(5)
    fields = random_batch(hi - lo, rng)
    probs = rng.uniform(0.5, 1.0, hi - lo) / batch
    learner = DQNLearner(OBS, ACTIONS, AGENT, torch.device("cpu"), seed=1)
    peers = LearnerPeers(comm, batch) if K > 1 else None

    def step() -> None:
        if peers is None:
            learner.train_step(fields, importance_weights(probs, batch, 0.4))
            return
        ctl = peers.control(False, False, smallest(probs), None, learner.steps)
        learner.train_step(fields, importance_weights(probs, batch, 0.4, smallest=float(np.min(ctl.stats))), peers)

    step()  # warm-up
    rates = []
    for _ in range(reps):
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        rates.append(steps / comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return {"rates": rates, "n_params": learner.n_params, "rows": [lo, hi], "threads": torch.get_num_threads()}


def measure_step(comm, opts: dict) -> dict:
    return measure(comm, int(opts.get("batch", 256)), int(opts.get("steps", 20)), int(opts.get("reps", 3)),
                   int(opts.get("threads", 1)))


if __name__ == "__main__":
    entry("mpirl.bench.learner_step_job", "step", measure_step)
