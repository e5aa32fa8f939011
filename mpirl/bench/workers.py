"""Workers: environment steps/s of sample collection in one process, with actors that infer, and with inference workers.

    mpirl bench workers [--reps 5]

Collection only: the learner never trains (``replay.learning_starts`` = the capacity, no insert budget), so
what is timed is the games, the inference and the messages. Two cases: predator-prey QMIX
(``jobs/predator_prey_qmix.toml``: 8 predators, 8 prey, 200-step episodes, the GRU agent network) and
Breakout Ape-X (``jobs/breakout_proposed_small.toml``: the Nature CNN, 84x84x4 frames). Four ways to
collect from the same number of games G (= actors x ``env.envs_per_actor``), one after the other, per
repetition:

* **single process**: one Python process plays the G games with one network, no MPI: an actor's
  games and decisions (:class:`~mpirl.actor_learner.actor.Acting`; DMCAF's single-process sampler), with Ape-X's
  initial priorities;
* **actors infer**: an MPI job, learner + buffer + A actors, each actor with its own network
  (``topology.workers = 0``, the layout before inference workers);
* **AW**: learner + buffer + A actors, the learner's rank answers the actors (``topology.workers =
  "learner"``, DMCAF's actor-worker);
* **AWL**: learner + buffer + K workers + A actors (``topology.workers = K``): actors only step
  games, the workers batch the forward passes (DMCAF's actor-worker-learner).

A job's rate is what its buffer heard: per sender (actor or worker) the env steps between its first
row once every sender has sent one (start-up, the first parameters and the first games' set-up are then
behind them all) and its last, over that time, summed. Each job runs until every sender's rows from
there span ``seconds``, however long this machine takes to get there, then stops cleanly. The settings:
the job's own shape (3 actors for QMIX, 2 for Breakout, 4 games each) with one worker, and DMCAF's AWL
shape (3 actors per worker) with as many workers as the machine has cores to spare. DMCAF measured
1.6-2.0x (AW) and 6.4-7.6x (AWL, 4 workers x 3 actors) over its single-process sampler on SMAC, on a
many-core machine; the ratios here are printed beside those.
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
from mpirl.bench.run_mpi import run_job_until, spanned

ROOT = Path(__file__).resolve().parents[2]
START = 1.0  # seconds of single-process play not counted (the first games' set-up, the first forward passes)
DEADLINE = 600.0  # a job's own wall-time limit: a backstop, it is stopped once its rows are in
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


def _checked(algorithm: str, job: Path, games: int, extra: tuple = ()):
    from mpirl import config
    from mpirl.registry import algorithm as algo
    cfg, _ = config.load(job, [*extra, f"env.envs_per_actor={games}"])
    return cfg, algo(algorithm).check(cfg, cfg.world_size, str(job))


def _timed(step, count, seconds: float) -> float:
    """Steps/s of ``step()`` over ``seconds`` after a warm-up (``count()``: env steps so far)."""
    t_end = time.perf_counter() + START
    while time.perf_counter() < t_end:
        step()
    steps0, t0 = count(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
    return (count() - steps0) / (time.perf_counter() - t0)


def single_process(case: Case, games: int, seconds: float, seed: int = 1, extra: tuple = ()) -> float:
    """Env steps/s of one process playing ``games`` games with one network (no MPI)."""
    import torch
    torch.set_num_threads(1)
    cfg, checked = _checked(case.algorithm, case.job, games, extra)
    from mpirl.actor_learner.actor import Acting
    if case.algorithm == "qmix":
        from mpirl.algos.qmix.playing import Deciding, Games
        acting = Acting(Games(cfg, checked.spaces, seed, "bench"), Deciding(cfg, checked.spaces, checked.spec, [seed]))
    else:
        from mpirl.algos.apex.serving import ApexDeciding, ApexGames
        acting = Acting(ApexGames(cfg, checked.spaces, seed, "bench"),
                        ApexDeciding(cfg, checked.spaces, checked.spec, [seed], [0], 1))
    acting.start()
    batch = cfg.comm.send_batch

    def step():
        acting.step()
        while acting.staged >= batch:  # Ape-X: the initial priorities, as an actor computes them per message
            acting.take(batch)
            acting.drop(batch)
    try:
        return _timed(step, lambda: acting.env_steps, seconds)
    finally:
        acting.close()


def sender_rows(run_dir: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per sender the (times, env steps) of its rows since every sender has sent one; {} until then.

    Reads the buffer's file while the job may still write it (no lock)."""
    with h5py.File(run_dir / "buffer_1.h5", "r", locking=False) as f:
        senders = [int(s) for s in f.attrs["actors"]]
        a = f["actors"]
        t, who, steps = a["time"][()], a["actor"][()], a["env_steps"][()]
    n = min(len(t), len(who), len(steps))  # a row being appended: not all its columns may be there yet
    t, who, steps = t[:n], who[:n], steps[:n]
    if not senders or any(not (who == s).any() for s in senders):
        return {}
    start = max(float(t[who == s].min()) for s in senders)  # the last sender's first row
    return {s: (t[(who == s) & (t >= start)], steps[(who == s) & (t >= start)]) for s in senders}


def job_rate(run_dir: Path, seconds: float) -> float:
    """Env steps/s the buffer heard from its senders once every sender was collecting."""
    rows = sender_rows(run_dir)
    if not spanned(rows, seconds):
        spans = {s: f"{len(ts)} rows over {ts[-1] - ts[0] if len(ts) > 1 else 0:.1f} s" for s, (ts, _) in rows.items()}
        raise RuntimeError(f"{run_dir}: the job ended before every sender's rows spanned {seconds:g} s "
                           f"({spans or 'a sender sent no row'})")
    return sum(float((st[-1] - st[0]) / (ts[-1] - ts[0])) for ts, st in rows.values())


def one_job(case: Case, actors: int, workers, seconds: float, out: Path, name: str, extra: tuple = ()) -> float:
    """``workers``: 0 (actors infer), "learner" (AW) or K worker ranks (AWL)."""
    sets = [*extra, *COLLECT, *case.collect, f"run.wall_seconds={DEADLINE:g}", f"topology.workers={workers}",
            "env.envs_per_actor=4"]
    ranks = 2 + actors + (workers if isinstance(workers, int) else 0)
    run_dir = run_job_until(ranks, str(case.job), sets, out, name, lambda d: spanned(sender_rows(d), seconds),
                            DEADLINE + 240, "workers")
    return job_rate(run_dir, seconds)


def settings(case: Case) -> list[tuple[str, int, int]]:
    """(label, actors, workers): the job's shape with one worker, and DMCAF's 3 actors per worker scaled to the cores."""
    spare = max(1, ((os.cpu_count() or 2) - 2) // 4)  # a worker and its 3 actors per 4 cores beyond learner + buffer
    out = [(f"{case.actors} actors x 4 games, 1 worker", case.actors, 1)]
    if spare > 1:
        out.append((f"DMCAF's shape: {spare} workers x 3 actors x 4 games", 3 * spare, spare))
    return out


def run(reps: int = MIN_REPS, seconds: float = 12.0, cases: tuple = ("qmix", "apex"), extra: tuple = ()) -> list[Row]:
    """``extra``: settings ("key=value") applied to every case's job first, on both sides (the suite's smaller
    game); the bench's own measurement uses the jobs as they are."""
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
                    values[SINGLE].append(single_process(case, games, seconds, extra=extra))
                    values[ACTORS].append(one_job(case, actors, 0, seconds, Path(tmp), f"{case.algorithm}-actors{rep}",
                                                  extra))
                    if workers == 1:  # AW has one worker: the learner
                        values[AW].append(one_job(case, actors, "learner", seconds, Path(tmp),
                                                  f"{case.algorithm}-aw{rep}", extra))
                    values[AWL].append(one_job(case, actors, workers, seconds, Path(tmp), f"{case.algorithm}-awl{rep}",
                                               extra))
                for ours in (AWL, AW, ACTORS):
                    if not values[ours]:
                        continue
                    src = SOURCE.get(ours, "")
                    r = Row(f"{case.title}, {label}: {ours} vs {SINGLE}", "env steps/s", ours, SINGLE,
                            note=f"{cores} cores; {src}" if src else f"{cores} cores")
                    r.values = {ours: values[ours], SINGLE: values[SINGLE]}
                    rows.append(r)
    return rows
