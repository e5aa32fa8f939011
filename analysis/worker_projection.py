"""How many actors one inference worker can serve, measured on this machine and projected to a 32-core node.

    python analysis/worker_projection.py [--games 4] [--seconds 3] [--cores 32]

In one process, no MPI (what one core of each role does), for predator-prey QMIX (8 agents):

* an actor's step: its ``--games`` games stepped once (``Games.step``), seconds per request;
* a worker's forward pass over b requests at once (``Deciding.observe`` + ``decide`` on b actors' outcomes),
  for b = 1, 2, 4, ..., 32: seconds per pass and per request;
* the bytes of one request (the step message) and one answer (the actions message).

The projection: the learner and the buffers on one node, the actors and workers on the other, C cores,
one core per rank. W workers with A actors each fit when W * (A + 1) <= C. A worker answering its A
actors together spends t_pass(A) per pass while each actor spends t_env stepping its games; in lockstep
each actor makes a request every t_env + t_pass(A) seconds (a lower bound: with the deadline, passes
overlap the actors' steps), so the node makes W * A * E / (t_env + t_pass(A)) env steps/s. Without
workers, C actors each run their own network: C * E / (t_env + t_pass(1)). The knee is the A with
the most env steps/s; the script prints it, the ratio to the node without workers, and the link bytes
per second of a worker's actors.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from mpirl import config
from mpirl.registry import algorithm
from mpirl.comm.messages import actions_layout, step_layout

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "jobs" / "predator_prey_qmix.toml"
BATCHES = (1, 2, 4, 8, 16, 32)


def timed(fn, seconds: float) -> float:
    """Median seconds of ``fn()`` over about ``seconds``."""
    times = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--games", type=int, default=4, help="games per actor (env.envs_per_actor)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per timing")
    p.add_argument("--cores", type=int, default=32, help="cores of the node to project to")
    args = p.parse_args()
    import torch

    from mpirl.algos.qmix.playing import Deciding, Games, step_spec
    from mpirl.envs.outcomes import Outcome
    torch.set_num_threads(1)
    cfg, _ = config.load(JOB, [f"env.envs_per_actor={args.games}", "qmix.epsilon_start=0.05"])
    ch = algorithm("qmix").check(cfg, 5, str(JOB))
    E = args.games
    games = Games(cfg, ch.spaces, 1, "projection")
    outcome = games.start()
    rng = np.random.default_rng(0)

    def env_step():  # uniformly random legal actions
        nonlocal outcome
        keys = np.where(outcome.rows["avail"], rng.random(outcome.rows["avail"].shape), -1.0)
        outcome = games.step(keys.argmax(axis=2))
    t_env = timed(env_step, args.seconds)
    games.close()

    request = step_layout(step_spec(ch.spaces), E).nbytes(E)
    answer = actions_layout(((ch.spaces.n_agents,), np.int64), E).nbytes(E)
    t_pass = {}
    for b in BATCHES:
        deciding = Deciding(cfg, ch.spaces, ch.spec, list(range(b)))
        rows = {k: v.copy() for k, v in outcome.rows.items()}
        rows["ended"][:] = False  # a step in mid-episode (an episode's end is 1 step in 200)
        for a in range(b):
            deciding.observe(a, Outcome(rows, fresh=True))
        step = Outcome(rows, fresh=False)
        actors = list(range(b))

        def serve():
            deciding.recorder.t[:] = 0  # stay inside the episode arrays however long the timing runs
            for a in actors:
                deciding.observe(a, step)
            deciding.decide(actors, [step] * b)
            deciding.staging.drop(deciding.staging.count)
        t_pass[b] = timed(serve, args.seconds)

    print(f"predator-prey QMIX, {ch.spaces.n_agents} agents, {E} games per actor; one core per rank")
    print(f"  actor: {E} games stepped once          {1e3 * t_env:8.3f} ms per request")
    print(f"  request / answer                      {request:8,d} / {answer:,d} bytes")
    C = args.cores
    alone = C * E / (t_env + t_pass[1])  # every core an actor that runs its own network
    print(f"  {'actors per worker A':>20} {'ms per pass':>12} {'ms per request':>15} {'workers on node':>16} "
          f"{'node env steps/s':>17}")
    best = (alone, 0)
    for b in BATCHES:
        w = C // (b + 1)
        node = w * b * E / (t_env + t_pass[b]) if w else 0.0  # lockstep: every actor waits for each pass
        best = max(best, (node, b))
        print(f"  {b:>20} {1e3 * t_pass[b]:>12.3f} {1e3 * t_pass[b] / b:>15.3f} {w:>16} {node:>17,.0f}")
    print(f"  {'no workers':>20} {'':>12} {'':>15} {'':>16} {alone:>17,.0f}   ({C} actors, each its own network)")
    node, a = best
    if a:
        rate = 1.0 / (t_env + t_pass[a])
        print(f"projection ({C} cores, lockstep, a lower bound): best at {a} actors per worker, {C // (a + 1)} workers: "
              f"{node:,.0f} env steps/s, {node / alone:.2f}x the node without workers; each worker's link "
              f"{a * rate * (request + answer) / 1e6:,.2f} MB/s")
    else:
        print(f"projection ({C} cores, lockstep, a lower bound): no split with workers beats {C} actors running "
              f"their own network ({alone:,.0f} env steps/s): a forward pass over one actor's games "
              f"({1e3 * t_pass[1]:.2f} ms) costs about what its games' step does ({1e3 * t_env:.2f} ms), and "
              f"batching saves at most {t_pass[1] / min(t_pass[b] / b for b in BATCHES):.1f}x of it")


if __name__ == "__main__":
    main()
