"""Workers: environment steps/s of sample collection in one process, with actors that infer, and with inference workers.

    mpirl bench workers [--reps 5]

Predator-prey QMIX (``jobs/predator_prey_qmix.toml``: 8 predators, 8 prey, 200-step episodes, the GRU
agent network), collection only: the learner never trains (``replay.learning_starts`` = the capacity,
no insert budget), so what is timed is the games, the inference and the messages. Three ways to
collect from the same number of games G (= actors x ``env.envs_per_actor``), one after the other, per
repetition:

* **single process**: one Python process plays the G games with its own network
  (:class:`~mpirl.algos.qmix.playing.Playing`, no MPI): DMCAF's single-process QMIX sampler;
* **actors infer**: an MPI job, learner + buffer + A actors, each actor with its own network
  (``topology.workers = 0``, the layout before inference workers);
* **AWL**: learner + buffer + K workers + A actors (``topology.workers = K``): actors only step
  games, the workers batch the forward passes (DMCAF's actor-worker-learner).

A job's rate is what its buffer heard: per sender (actor or worker) the env steps between its first
row after a warm-up and its last, over that time, summed. The settings: 3 actors (G = 12) with one
worker, and DMCAF's AWL shape (3 actors per worker) with as many workers as the machine has cores to
spare. DMCAF measured 1.6-2.0x (AW) and 6.4-7.6x (AWL, 4 workers x 3 actors) over its single-process
sampler on SMAC, on a many-core machine; the ratios here are printed beside those.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from mpirl.bench.report import MIN_REPS, Row
from mpirl.bench.run_mpi import run_job

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "predator_prey_qmix.toml"
WARM = 4.0  # seconds of each job not counted (start-up, first parameters, the first games' set-up)
SINGLE, ACTORS, AWL = "single process", "actors infer", "AWL"
COLLECT = ["run.train_steps=0", "run.env_steps=0", "replay.capacity=200", "replay.learning_starts=200",
           "replay.samples_per_insert=0", "log.interval=0.5", "checkpoint.every_seconds=0"]


def single_process(games: int, seconds: float, seed: int = 1) -> float:
    """Env steps/s of one process playing ``games`` games with its own network (no MPI)."""
    import torch

    from mpirl import config
    from mpirl.algos import algorithm
    from mpirl.algos.qmix.playing import Playing
    torch.set_num_threads(1)
    cfg, _ = config.load(JOB, [f"env.envs_per_actor={games}"])
    checked = algorithm("qmix").check(cfg, 5, str(JOB))
    playing = Playing(cfg, checked.spaces, checked.spec, seed, label="bench")
    playing.start()
    t_end = time.perf_counter() + WARM / 4
    while time.perf_counter() < t_end:  # warm-up
        playing.step()
        playing.staging.drop(playing.staging.count)
    steps0, t0 = playing.env_steps, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        playing.step()
        playing.staging.drop(playing.staging.count)
    rate = (playing.env_steps - steps0) / (time.perf_counter() - t0)
    playing.close()
    return rate


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


def one_job(actors: int, workers: int, seconds: float, out: Path, name: str) -> float:
    sets = [*COLLECT, f"run.wall_seconds={seconds + WARM}", f"topology.workers={workers}", "env.envs_per_actor=4"]
    return job_rate(run_job(2 + workers + actors, str(JOB), sets, out, name, seconds + 240, "workers"))


def settings() -> list[tuple[str, int, int]]:
    """(label, actors, workers): equal games with one worker, and DMCAF's 3 actors per worker scaled to the cores."""
    spare = max(1, ((os.cpu_count() or 2) - 2) // 4)  # a worker and its 3 actors per 4 cores beyond learner + buffer
    out = [("3 actors x 4 games, 1 worker", 3, 1)]
    if spare > 1:
        out.append((f"DMCAF's shape: {spare} workers x 3 actors x 4 games", 3 * spare, spare))
    return out


def run(reps: int = MIN_REPS, seconds: float = 12.0) -> list[Row]:
    try:
        import pettingzoo  # noqa: F401
    except ImportError:
        raise RuntimeError("the workers benchmark runs QMIX on predator-prey: pip install 'mpirl[marl]'") from None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, actors, workers in settings():
            games = 4 * actors
            values = {SINGLE: [], ACTORS: [], AWL: []}
            for rep in range(reps):
                values[SINGLE].append(single_process(games, seconds))
                values[ACTORS].append(one_job(actors, 0, seconds, Path(tmp), f"actors{rep}"))
                values[AWL].append(one_job(actors, workers, seconds, Path(tmp), f"awl{rep}"))
            cores = os.cpu_count()
            for ours, src in ((AWL, "DMCAF: AWL 6.4-7.6x"), (ACTORS, "")):
                r = Row(f"QMIX sample collection, {label}: {ours} vs {SINGLE}", "env steps/s", ours, SINGLE,
                        note=f"{cores} cores; {src}" if src else f"{cores} cores")
                r.values = {ours: values[ours], SINGLE: values[SINGLE]}
                rows.append(r)
    return rows
