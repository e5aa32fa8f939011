"""How fast a rank computes while n ranks compute at once on this machine: the scaling model's shared cores
(:func:`mpirl.bench.projection.local_allreduce` and its siblings), measured by ``mpirl bench gradients``:

    mpiexec -n N python -m mpirl.bench.busy_cores_job busy OUT.json \\
        '{"workload": "a3c-cartpole", "reps": 3, "seconds": 1.0, "batch": 128}'

Every rank runs the same work with no messages between ranks (one torch thread each), ``reps`` repetitions of
about ``seconds`` from a barrier; rank 0 writes each rank's calls/s per repetition. The work:

* ``a3c-cartpole``: a rollout of ``jobs/a3c_cartpole.toml``'s worker without its exchange: 16 steps of its 8
  CartPole games with the MLP's actions, the gradient of the rollout, the optimizer step.
* ``apex-cnn``: one Ape-X train step of the Nature CNN on ``batch`` random rows, alone (what one of K data-parallel
  learners computes of its part, without the sums: :mod:`mpirl.bench.learner_step_job` without peers).

A rank's rate with N ranks busy over its rate alone (N = 1) is the share of a core it gets: 1 / N x the cores
while the ranks outnumber them, less where busy cores slow each other (shared caches, memory bandwidth).
"""

from __future__ import annotations

import numpy as np
import torch
from mpi4py import MPI

from mpirl.bench.mpi_entry import main as entry
from mpirl.bench.report import rate

WORKLOADS = ("a3c-cartpole", "apex-cnn")


def a3c_cartpole():
    """One call: a rollout of the CartPole job's worker without its exchange: 16 steps of its 8 games (the worker's
    games, :class:`mpirl.envs.games.VectorGames`) with the MLP's actions, the rollout's gradient, the optimizer step.
    Also returned: the games, to close."""
    from mpirl.agents.a3c import A3cModel, Rollout
    from mpirl.bench.gradients import job_config
    from mpirl.envs.games import VectorGames
    cfg, checked = job_config()
    rank = MPI.COMM_WORLD.rank
    model = A3cModel(checked.spaces.obs_shape, checked.spaces.action, cfg.agent, cfg.a3c, torch.device("cpu"), 1,
                     True)
    games = VectorGames(cfg, checked.spaces, 1000 + rank, f"busy rank {rank}")
    T, E = cfg.a3c.unroll, cfg.env.envs_per_actor
    rng = np.random.default_rng(rank)
    ro = Rollout(T, E, checked.spaces.obs_shape, np.float32)
    grad = np.zeros(model.n_params, np.float32)
    state = {"obs": games.start().rows["obs"].copy()}

    def call() -> None:
        model.begin(ro)
        for t in range(T):
            obs = state["obs"]
            actions, logp, values = model.act(obs, rng)
            o = games.step(actions).rows
            ro.obs[t], ro.action[t], ro.logp[t], ro.value[t] = obs, actions, logp, values
            ro.reward[t], ro.terminated[t], ro.truncated[t] = o["reward"], o["terminated"], o["truncated"]
            state["obs"] = o["obs"].copy()
        ro.steps = T
        ro.bootstrap[:] = model.values(state["obs"])
        model.gradient(model.prepare(ro), None, grad)
        model.apply(grad)
    return call, games


def apex_cnn(batch: int):
    """One call: the Nature CNN's Ape-X train step on ``batch`` rows with no peers."""
    from mpirl.agents.dqn import DQNLearner
    from mpirl.bench.learner_step_job import ACTIONS, AGENT, OBS, random_batch
    from mpirl.replay.weights import importance_weights
    rng = np.random.default_rng(5)
    fields = random_batch(batch, rng)
    weights = importance_weights(rng.uniform(0.5, 1.0, batch) / batch, batch, 0.4)
    learner = DQNLearner(OBS, ACTIONS, AGENT, torch.device("cpu"), seed=1)
    return lambda: learner.train_step(fields, weights)


def measure(comm, opts: dict) -> dict:
    workload = opts.get("workload", "a3c-cartpole")
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r}: not one of {WORKLOADS}")
    torch.set_num_threads(1)
    games = None
    if workload == "a3c-cartpole":
        call, games = a3c_cartpole()
    else:
        call = apex_cnn(int(opts.get("batch", 128)))
    # each repetition from a barrier: every rank's calls/s over about ``seconds`` (a warm-up call first)
    mine = rate(call, 1, int(opts.get("reps", 3)), float(opts.get("seconds", 1.0)), setup=comm.Barrier)
    if games is not None:
        games.close()
    every = comm.gather(mine, root=0)
    rates = [list(rep) for rep in zip(*every)] if comm.rank == 0 else []
    return {"workload": workload, "rates": rates}  # per repetition, each rank's calls/s


if __name__ == "__main__":
    entry("mpirl.bench.busy_cores_job", "busy", measure)
