"""QMIX's acting split in two (games | decisions): a worker's decisions for many actors, in forward passes over
any subset of them, record exactly the episodes each actor records on its own."""

from __future__ import annotations

import numpy as np

from mpirl import config
from mpirl.registry import algorithm

from conftest import JOBS


def job(*sets):
    cfg, _ = config.load(JOBS / "predator_prey_qmix.toml", ["env.max_episode_steps=7", "env.envs_per_actor=2",
                                                            "qmix.epsilon_anneal_steps=40", *sets])
    checked = algorithm("qmix").check(cfg, 5, "job.toml")
    return cfg, checked


def drain(deciding, into: list) -> None:
    """Move the staged episodes out (as the sender does), each as its bytes."""
    n = deciding.staging.count
    rows = deciding.staging.take(n)
    into += [b"".join(np.ascontiguousarray(arr[i]).tobytes() for arr in rows.values()) for i in range(n)]
    deciding.staging.drop(n)


def test_a_worker_records_what_each_actor_records_alone():
    from mpirl.algos.qmix.playing import Deciding, Games
    from mpirl.actor_learner.actor import Acting
    cfg, ch = job()
    seeds = [11, 22, 33]
    params = np.random.default_rng(0).standard_normal(ch.n_params).astype(np.float32) * 0.3

    # Each actor alone: its games and the decisions for it, as the actor loop (mpirl.actor_learner.actor) holds them.
    alone = [Acting(Games(cfg, ch.spaces, s, label=f"actor {a}"), Deciding(cfg, ch.spaces, ch.spec, [s]))
             for a, s in enumerate(seeds)]
    for p in alone:
        p.policy.load_flat(params)
        p.start()
    expected = []
    for _ in range(40):
        for p in alone:
            p.step()
            drain(p.deciding, expected)
    expected.sort()
    assert len(expected) >= 3 * 2 * 5  # episodes of 7 steps: every game finished several

    games = [Games(cfg, ch.spaces, s, label=f"actor {a}") for a, s in enumerate(seeds)]
    worker = Deciding(cfg, ch.spaces, ch.spec, seeds)
    worker.policy.load_flat(params)
    outcome = {a: g.start() for a, g in enumerate(games)}
    for a in range(3):
        worker.observe(a, outcome[a])
    steps, got = dict.fromkeys(range(3), 0), []
    # The actors' requests arrive in changing groups: the forward pass covers whoever is waiting.
    groups = [[0, 1, 2], [2], [0, 1], [1, 2, 0], [0], [1], [2, 0]]
    i = 0
    while min(steps.values()) < 40:
        ready = [a for a in groups[i % len(groups)] if steps[a] < 40]
        i += 1
        if not ready:
            continue
        obs = np.concatenate([outcome[a].rows["obs"] for a in ready])
        avail = np.concatenate([outcome[a].rows["avail"] for a in ready])
        actions = worker.act(ready, obs, avail)
        for j, a in enumerate(ready):
            outcome[a] = games[a].step(actions[j * 2:(j + 1) * 2])
            worker.observe(a, outcome[a])
            steps[a] += 1
        drain(worker, got)
    assert sorted(got) == expected
    assert worker.env_steps.tolist() == [p.env_steps for p in alone]
    assert [worker.epsilon(a) for a in range(3)] == [p.epsilon() for p in alone]


def test_worker_projection_times_steps_and_passes_and_projects_a_node():
    import subprocess
    import sys

    from conftest import ROOT
    proc = subprocess.run([sys.executable, "analysis/worker_projection.py", "--seconds", "0.05", "--cores", "8"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "request / answer" in out and "7,680 / 288 bytes" in out  # 4 games of 8 agents each way
    assert "no workers" in out and "projection (8 cores" in out, out
