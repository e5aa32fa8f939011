"""Workers: environment steps/s of sample collection in one process, with actors that infer, and with inference workers.

    mpirl bench workers [--reps 5]

Collection only: the learner never trains (``replay.learning_starts`` = the capacity, no insert budget), so
what is timed is the games, the inference and the messages. Two cases: predator-prey QMIX
(``jobs/predator_prey_qmix.toml``: 8 predators, 8 prey, 200-step episodes, the GRU agent network) and
Breakout Ape-X (``jobs/breakout_proposed_small.toml``: the Nature CNN, 84x84x4 frames). Four ways to
collect from the same number of games G (= actors x ``env.envs_per_actor``), one after the other, per
repetition:

* **single process**: one Python process plays the G games with one network, no MPI (QMIX:
  :class:`~mpirl.algos.qmix.playing.Playing`, DMCAF's single-process sampler; Ape-X: the games and the
  decisions a worker makes, :mod:`mpirl.algos.apex.serving`, with the initial priorities);
* **actors infer**: an MPI job, learner + buffer + A actors, each actor with its own network
  (``topology.workers = 0``, the layout before inference workers);
* **AW**: learner + buffer + A actors, the learner's rank answers the actors (``topology.workers =
  "learner"``, DMCAF's actor-worker);
* **AWL**: learner + buffer + K workers + A actors (``topology.workers = K``): actors only step
  games, the workers batch the forward passes (DMCAF's actor-worker-learner).

A job's rate is what its buffer heard: per sender (actor or worker) the env steps between its first
row after a warm-up and its last, over that time, summed. The settings: the job's own shape (3 actors
for QMIX, 2 for Breakout, 4 games each) with one worker, and DMCAF's AWL shape (3 actors per worker)
with as many workers as the machine has cores to spare. DMCAF measured 1.6-2.0x (AW) and 6.4-7.6x (AWL,
4 workers x 3 actors) over its single-process sampler on SMAC, on a many-core machine; the ratios here
are printed beside those.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from mpirl.bench.report import MIN_REPS, Row
from mpirl.bench.run_mpi import run_job

ROOT = Path(__file__).resolve().parents[2]
WARM = 4.0  # seconds of each job not counted (start-up, first parameters, the first games' set-up)
SINGLE, ACTORS, AW, AWL = "single process", "actors infer", "AW", "AWL"
SOURCE = {AW: "DMCAF: AW 1.6-2.0x", AWL: "DMCAF: AWL 6.4-7.6x"}


@dataclass(frozen=True)
class Case:
    algorithm: str
    title: str
    job: Path
    actors: int  # the job's own shape: actors of 4 games each
    collect: tuple  # settings that make a job collect without training


CASES = {
    "qmix": Case("qmix", "QMIX sample collection (predator-prey, 8 agents)", ROOT / "jobs" / "predator_prey_qmix.toml",
                 3, ("replay.capacity=200", "replay.learning_starts=200")),
    "apex": Case("apex", "Ape-X sample collection (Breakout)", ROOT / "jobs" / "breakout_proposed_small.toml",
                 2, ("replay.learning_starts=32768",)),  # the job's capacity: 8 games fill it in about a minute
}
COLLECT = ("run.train_steps=0", "run.env_steps=0", "replay.samples_per_insert=0", "log.interval=0.5",
           "checkpoint.every_seconds=0")


def _checked(algorithm: str, job: Path, games: int):
    from mpirl import config
    from mpirl.algos import algorithm as algo
    cfg, _ = config.load(job, [f"env.envs_per_actor={games}"])
    return cfg, algo(algorithm).check(cfg, cfg.world_size, str(job))


def _timed(step, count, seconds: float) -> float:
    """Steps/s of ``step()`` over ``seconds`` after a warm-up (``count()``: env steps so far)."""
    t_end = time.perf_counter() + WARM / 4
    while time.perf_counter() < t_end:
        step()
    steps0, t0 = count(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
    return (count() - steps0) / (time.perf_counter() - t0)


def single_process(case: Case, games: int, seconds: float, seed: int = 1) -> float:
    """Env steps/s of one process playing ``games`` games with one network (no MPI)."""
    import torch
    torch.set_num_threads(1)
    cfg, checked = _checked(case.algorithm, case.job, games)
    if case.algorithm == "qmix":
        from mpirl.algos.qmix.playing import Playing
        playing = Playing(cfg, checked.spaces, checked.spec, seed, label="bench")
        playing.start()

        def step():
            playing.step()
            playing.staging.drop(playing.staging.count)
        try:
            return _timed(step, lambda: playing.env_steps, seconds)
        finally:
            playing.close()
    from mpirl.algos.apex.serving import ApexDeciding, ApexGames
    g = ApexGames(cfg, checked.spaces, seed, "bench")
    d = ApexDeciding(cfg, checked.spaces, checked.spec, [seed], [0], 1)
    state = {"outcome": g.start()}
    d.observe(0, state["outcome"])
    batch = cfg.comm.send_batch

    def step():
        state["outcome"] = g.step(d.decide([0], [state["outcome"]]))
        d.observe(0, state["outcome"])
        while d.staging.count >= batch:  # the initial priorities, as an actor computes them per message
            d.take(batch)
            d.drop(batch)
    try:
        return _timed(step, lambda: int(d.env_steps[0]), seconds)
    finally:
        g.close()


def job_rate(run_dir: Path) -> float:
    """Env steps/s the buffer heard from its senders after the warm-up."""
    with h5py.File(run_dir / "buffer_1.h5", "r") as f:
        a = f["actors"]
        t, who, steps = a["time"][()], a["actor"][()], a["env_steps"][()]
    total = 0.0
    for s in np.unique(who):
        keep = (who == s) & (t >= WARM)
        if keep.sum() < 2:
            raise RuntimeError(f"{run_dir}: sender {s} has {keep.sum()} rows after {WARM:.0f} s; raise --seconds")
        ts, st = t[keep], steps[keep]
        total += (st[-1] - st[0]) / (ts[-1] - ts[0])
    return total


def one_job(case: Case, actors: int, workers, seconds: float, out: Path, name: str) -> float:
    """``workers``: 0 (actors infer), "learner" (AW) or K worker ranks (AWL)."""
    sets = [*COLLECT, *case.collect, f"run.wall_seconds={seconds + WARM}", f"topology.workers={workers}",
            "env.envs_per_actor=4"]
    ranks = 2 + actors + (workers if isinstance(workers, int) else 0)
    return job_rate(run_job(ranks, str(case.job), sets, out, name, seconds + 240, "workers"))


def settings(case: Case) -> list[tuple[str, int, int]]:
    """(label, actors, workers): the job's shape with one worker, and DMCAF's 3 actors per worker scaled to the cores."""
    spare = max(1, ((os.cpu_count() or 2) - 2) // 4)  # a worker and its 3 actors per 4 cores beyond learner + buffer
    out = [(f"{case.actors} actors x 4 games, 1 worker", case.actors, 1)]
    if spare > 1:
        out.append((f"DMCAF's shape: {spare} workers x 3 actors x 4 games", 3 * spare, spare))
    return out


def run(reps: int = MIN_REPS, seconds: float = 12.0, cases: tuple = ("qmix", "apex")) -> list[Row]:
    if "qmix" in cases:
        try:
            import pettingzoo  # noqa: F401
        except ImportError:
            raise RuntimeError("the workers benchmark runs QMIX on predator-prey: pip install 'mpirl[marl]'") from None
    rows = []
    cores = os.cpu_count()
    with tempfile.TemporaryDirectory() as tmp:
        for case in (CASES[c] for c in cases):
            for label, actors, workers in settings(case):
                games = 4 * actors
                values = {SINGLE: [], ACTORS: [], AW: [], AWL: []}
                for rep in range(reps):
                    values[SINGLE].append(single_process(case, games, seconds))
                    values[ACTORS].append(one_job(case, actors, 0, seconds, Path(tmp), f"{case.algorithm}-actors{rep}"))
                    if workers == 1:  # AW has one worker: the learner
                        values[AW].append(one_job(case, actors, "learner", seconds, Path(tmp),
                                                  f"{case.algorithm}-aw{rep}"))
                    values[AWL].append(one_job(case, actors, workers, seconds, Path(tmp), f"{case.algorithm}-awl{rep}"))
                for ours in (AWL, AW, ACTORS):
                    if not values[ours]:
                        continue
                    src = SOURCE.get(ours, "")
                    r = Row(f"{case.title}, {label}: {ours} vs {SINGLE}", "env steps/s", ours, SINGLE,
                            note=f"{cores} cores; {src}" if src else f"{cores} cores")
                    r.values = {ours: values[ours], SINGLE: values[SINGLE]}
                    rows.append(r)
    return rows
