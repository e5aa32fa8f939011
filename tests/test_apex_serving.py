"""Ape-X's acting, one implementation in two places (SEED RL's layout): an inference worker's decisions for several
actors, in forward passes over changing groups of them, record exactly the n-step transitions, priorities and
episodes each actor records on its own with the same games and decisions (:class:`mpirl.actor_learner.actor.Acting`)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from mpirl import config
from mpirl.agents.exploration import env_epsilons
from mpirl.registry import algorithm
from mpirl.algos.apex.serving import ApexDeciding, ApexGames
from mpirl.actor_learner.actor import Acting

from conftest import JOBS, run_cli, run_mpi


def drain(staging, take, into: list) -> None:
    n = staging.count
    records, priorities = take(n)
    into += [(b"".join(np.ascontiguousarray(arr[i]).tobytes() for arr in records.values()), float(priorities[i]))
             for i in range(n)]
    staging.drop(n)


def test_a_worker_records_what_each_apex_actor_records_alone():
    cfg, _ = config.load(JOBS / "cartpole.toml", ["env.envs_per_actor=2", "apex.n_step=3"])
    ch = algorithm("apex").check(cfg, 6, "job.toml")
    s = ch.spaces
    seeds, n_actors = [5, 6, 7], 3
    params = (np.random.default_rng(0).standard_normal(ch.n_params) * 0.1).astype(np.float32)

    expected, episodes_alone = [], []
    for i, seed in enumerate(seeds):
        # Actor i of 3 alone: its games and the decisions for it alone, as the actor loop holds them.
        acting = Acting(ApexGames(cfg, s, seed, f"actor {i}"), ApexDeciding(cfg, s, ch.spec, [seed], [i], n_actors))
        np.testing.assert_array_equal(acting.deciding.epsilons[0], env_epsilons(i, n_actors, 2, 0.4, 7.0))
        acting.policy.load_flat(params)
        acting.start()
        for _ in range(120):
            acting.step()
            drain(acting.staging, acting.take, expected)
        episodes_alone += list(acting.episodes)
        acting.close()

    games = [ApexGames(cfg, s, seed, f"actor {i}") for i, seed in enumerate(seeds)]
    worker = ApexDeciding(cfg, s, ch.spec, seeds, [0, 1, 2], n_actors)
    worker.policy.load_flat(params)
    outcome = {a: g.start() for a, g in enumerate(games)}
    for a in range(3):
        worker.observe(a, outcome[a])
    got, steps, groups, i = [], dict.fromkeys(range(3), 0), [[0, 1, 2], [1], [2, 0], [0], [2, 1, 0], [1, 2]], 0
    while min(steps.values()) < 120:
        ready = [a for a in groups[i % len(groups)] if steps[a] < 120]
        i += 1
        if not ready:
            continue
        actions = worker.decide(ready, [outcome[a] for a in ready])
        for j, a in enumerate(ready):
            outcome[a] = games[a].step(actions[2 * j:2 * j + 2])
            worker.observe(a, outcome[a])
            steps[a] += 1
        drain(worker.staging, worker.take, got)
    for g in games:
        g.close()
    got, expected = sorted(got), sorted(expected)
    assert len(expected) > 600 and [r for r, _ in got] == [r for r, _ in expected]  # the transitions, bit for bit
    # Priorities from forward passes over other batch compositions: equal up to float32 rounding.
    np.testing.assert_allclose([p for _, p in got], [p for _, p in expected], rtol=1e-5)
    assert sorted(worker.episodes) == sorted(episodes_alone) and len(episodes_alone) >= 6
    assert worker.env_steps.tolist() == [240, 240, 240]


@pytest.mark.mpi
@pytest.mark.parametrize("workers, architecture", [("1", "proposed"), ("learner", "baseline")])
def test_an_apex_job_with_an_inference_worker(tmp_path, workers, architecture):
    """CartPole with one worker serving two actors (a worker rank, or the learner's rank: DMCAF's AW): the worker
    infers, computes the initial priorities and keeps each actor's epsilons; priorities flow back (proposed) or
    the dumps train (baseline); every rank exits 0."""
    on_learner = workers == "learner"
    n, w = (4, 0) if on_learner else (5, 2)
    job = run_mpi(n, tmp_path, "run.train_steps=400", "run.target_return=nan", "replay.learning_starts=300",
                  f"topology.workers={workers}", f"replay.architecture={architecture}", "log.interval=0.2")
    assert job.proc.returncode == 0, job.output
    roles = ("0 learner and worker; 1 buffer; 2-3 actors of worker 0" if on_learner
             else "0 learner; 1 buffer, 2 worker of buffer 1; 3-4 actors of worker 2")
    assert f"ranks: {roles}" in job.output, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed"
        assert f["learner/train/train_steps"][-1] == 400
        buf = f["buffer_1/buffer"]
        assert buf["experiences_in"][-1] >= 300
        assert buf["priority_updates"][-1] > 0 if architecture == "proposed" else buf["bytes_out"][-1] > 0
        assert set(f["buffer_1/actors"]["actor"][()]) == {w}
        # The worker keeps each actor's Ape-X epsilon (0.4 and 0.4 ** 8 for two one-game actors), reports the mean.
        eps = [env_epsilons(i, 2, 1, 0.4, 7.0)[0] for i in (0, 1)]
        assert eps == pytest.approx([0.4, 0.4 ** 8])
        assert f["buffer_1/actors"]["epsilon"][-1] == pytest.approx(np.mean(eps))
        act = f[f"worker_{w}/actors"]
        assert set(act["actor"][()]) == {n - 2, n - 1} and (act["env_steps"][()] > 0).any()
        assert f[f"worker_{w}/worker"]["steps_served"][-1] > 0
    info = run_cli("info", str(job.run_dir))
    assert info.returncode == 0 and f"worker_{w}      steps served" in info.stdout, info.stdout
