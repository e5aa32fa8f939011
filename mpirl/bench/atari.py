"""Atari at 84x84: env frames/s collected and samples/s trained, ours against the libraries, on the same game, the
same cores and the same wall.

    mpirl bench atari [--reps 5] [--atari-wall 60] [--game pong|breakout]

Per seed, back to back on this machine, each for ``--atari-wall`` seconds of its own clock:

* ours, IMPALA (``jobs/impala_<game>.toml``: asynchronous, 4 ranks: the learner, one trajectory queue and 2 actors
  of 8 games; unroll 20, batches of 32 trajectories; the Nature CNN; no test round);
* ours, PPO (``jobs/ppo_<game>.toml``: DD-PPO's allreduce, 2 workers of 8 games; rollouts of 128 steps, 4 epochs
  of 4 minibatches a worker; the Nature CNN; no test round);
* Sample Factory 2.1.1's APPO with its Atari example's settings (``refs/sf_run.py``: 2 rollout workers of 8 games,
  one policy worker);
* RLlib 2.60's APPO and IMPALA with its Atari examples' settings (``refs/rllib_run.py``: 2 env runners of 8 games,
  the learner in the driver).

Every implementation plays ale-py's game at 84x84 grey, 4-frame stacks, frame skip 4, repeat_action_probability 0,
and its own process start-up is left out: **each side's clock runs from its own first env step** (ours: the
earliest ``started_s`` of its actors (IMPALA: the buffers' ``actors`` tables) or workers (PPO: ``worker_*.h5``) on
the job clock; the references' from the first step any of their workers took) to its last count; the start-up
(imports, MPI or Ray or Sample Factory's workers, model construction, to the first env step) is reported apart.
The counts, like for like:

* **env frames/s collected**: agent steps x frame skip (4) over those seconds (ours IMPALA: the learner's count of
  the env steps its actors had reported, at its last row within the seconds; ours PPO: each worker's steps at its
  last rollout within them);
* **samples/s trained, every pass counted**: ours IMPALA each trajectory step once (trajectories x unroll); ours PPO
  every sample of every epoch (gradients x minibatch size, all workers); Sample Factory every sample of each of its
  4 epochs; RLlib APPO each pass of its circular buffer (up to 2 a batch), IMPALA once;
* **learner busy**: the share of those seconds the learner spent computing (ours IMPALA: its ``compute_s``; ours PPO
  the workers' compute share, acting included, as their learner is the same process; the references' where their
  own timers say, else left out).

The rows are ours (IMPALA, and PPO) against each library, and against the best library per quantity (the target:
ours at least 1.5x the best library, collected and trained).
"""

from __future__ import annotations

import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import h5py
import numpy as np

from mpirl.bench.refs.ale_env import FRAMESKIP  # one frame skip for ours and the libraries' wrappers
from mpirl.bench.report import MIN_REPS, Row
from mpirl.bench.impala import library
from mpirl.bench.solve import first_env_step
from mpirl.launcher import find_mpiexec, launch_command

ROOT = Path(__file__).resolve().parents[2]
REFS = Path(__file__).resolve().parent / "refs"
GAMES = {"pong": "ALE/Pong-v5", "breakout": "ALE/Breakout-v5"}
ENVS_PER_RUNNER = 8  # every implementation: 2 runners (actors, workers, env runners) of 8 games
BUDGET = 10_000_000  # env steps: never reached within a wall of minutes
TARGET = 1.5  # ours against the best library, collected and trained

IMPALA = "mpirl IMPALA async"
PPO = "mpirl PPO allreduce"
OURS = (IMPALA, PPO)


STEPS = re.compile(r"([\d,]+) env steps")  # the progress line's env steps (mpirl.metrics.progress)
STOPPED = 75  # a job's exit after its clean stop on a signal


def _launch(job: Path, ranks: int, name: str, sets: list[str], wall: float, out: Path) -> tuple[Path, float]:
    """Our job under ``mpiexec``, stopped cleanly (SIGUSR1, a batch system's notice) ``wall`` seconds after its
    progress line first counts env steps, so that its own clock holds ``wall`` seconds from its first env step
    (the counts are read over exactly those seconds afterwards); its run directory and the command's seconds."""
    cmd, env = launch_command(find_mpiexec(), ranks, str(job),
                              [*sets, f'run.out_dir="{out}"', f'run.name="{name}"', "log.progress_seconds=1.0",
                               f"run.wall_seconds={wall + START_ALLOWANCE}"], [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    stepping: list[float] = []  # when the progress line first counted env steps

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            found = STEPS.search(line)
            if not stepping and found and int(found.group(1).replace(",", "")) > 0:
                stepping.append(time.perf_counter())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stopped = False
    try:
        while proc.poll() is None:
            time.sleep(0.2)
            if not stopped and stepping and time.perf_counter() >= stepping[0] + wall + 1.0:
                proc.send_signal(signal.SIGUSR1)  # Open MPI forwards it: the job's clean stop
                stopped = True
            if time.perf_counter() - t0 > wall + START_ALLOWANCE + 300:
                raise RuntimeError(f"mpirl {name} did not end: {''.join(lines)[-2000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
    took = time.perf_counter() - t0
    if proc.returncode not in (0, STOPPED):
        raise RuntimeError(f"mpirl {name} run failed (exit {proc.returncode}): {''.join(lines)[-2000:]}")
    return sorted(out.glob(f"{name}-*/run.h5"))[-1].parent, took


def _start_up(run_dir: Path, first_step: float, took: float) -> float:
    """Seconds from the command's start to the first env step: the command's seconds less the job clock's, plus
    the job clock's first step (the exit's teardown after the last write is counted in, to our cost)."""
    with h5py.File(run_dir / "run.h5", "r") as f:
        job_seconds = float(f.attrs["wall_seconds"])
    return took - job_seconds + first_step


START_ALLOWANCE = 120.0  # seconds a job may take from its clock's start to its first env step, on top of the wall


def _until(times: np.ndarray, end: float) -> int:
    """The index of the last row written at or before ``end`` (-1: none)."""
    return int(np.searchsorted(times, end, side="right")) - 1


def impala_counts(run_dir: Path, wall: float) -> dict:
    """An IMPALA run's counts over ``wall`` seconds of its own clock, from its actors' first env step: the
    learner's last row within them (its env steps as the actors reported them, trajectories x unroll trained)."""
    first = first_env_step(run_dir)
    with h5py.File(run_dir / "learner.h5", "r") as f:
        t = f["train"]
        i = _until(t["time"][()], first + wall)
        if i < 0:
            raise RuntimeError(f"{run_dir}: the learner wrote no row within {wall:g} s of the first env step")
        end = float(t["time"][i])
        seconds = end - first
        return {"env_steps_sampled": int(t["env_steps"][i]),
                "env_steps_trained": int(t["samples_trained"][i]) * int(f.attrs["unroll"]),
                "seconds": seconds, "first_step": first, "learner_busy": float(t["compute_s"][i]) / seconds}


def ppo_counts(run_dir: Path, wall: float) -> dict:
    """A PPO run's counts over ``wall`` seconds of its own clock, from its workers' first env step: each worker's
    last rollout row within them (its env steps, every gradient's minibatch trained, its compute share)."""
    from mpirl.trained.runs import job_of
    minibatches = job_of(run_dir).a3c.minibatches
    workers = []
    for path in sorted(run_dir.glob("worker_*.h5")):
        with h5py.File(path, "r") as f:
            samples = int(f.attrs["unroll"]) * int(f.attrs["envs"])  # a rollout's (these jobs preempt none)
            workers.append((float(f.attrs["started_s"]), samples // minibatches,
                            {k: f["rollouts"][k][()] for k in ("time", "env_steps", "gradients", "compute_s",
                                                               "wait_s")}))
    first = min(start for start, _, _ in workers)
    steps = trained = 0
    end, compute, wait = first, 0.0, 0.0
    for _, minibatch, r in workers:
        j = _until(r["time"], first + wall)
        if j < 0:
            raise RuntimeError(f"{run_dir}: a worker finished no rollout within {wall:g} s of the first env step")
        steps += int(r["env_steps"][j])
        trained += int(r["gradients"][j]) * minibatch  # each gradient's minibatch, every epoch's
        end = max(end, float(r["time"][j]))
        compute, wait = compute + float(r["compute_s"][j]), wait + float(r["wait_s"][j])
    return {"env_steps_sampled": steps, "env_steps_trained": trained, "seconds": end - first, "first_step": first,
            "learner_busy": compute / (compute + wait)}


OUR_JOBS = {  # ours: (jobs/<prefix>_<game>.toml, its ranks, the section of its test round, its counts)
    IMPALA: ("impala", 4, "impala", impala_counts),
    PPO: ("ppo", 2, "a3c", ppo_counts),
}


def job_file(which: str, game: str) -> Path:
    """Ours' job file for ``which`` (IMPALA or PPO) on ``game``: ``jobs/<prefix>_<game>.toml``."""
    return ROOT / "jobs" / f"{OUR_JOBS[which][0]}_{game}.toml"


def launch_ours(which: str, game: str, seed: int, wall: float, out: Path, sets: tuple[str, ...] = (),
                ranks: int | None = None, name: str | None = None) -> tuple[Path, float]:
    """One run of ours (``which``: IMPALA or PPO) on ``game`` with 8 games an acting rank and no test round, stopped
    ``wall`` seconds after its first env step (:func:`_launch`); ``sets``: more of its fields; ``ranks``: other than
    the bench's; ``name``: the run's (default ``atari-<prefix>-s<seed>``). Its run directory (under ``out``) and the
    command's seconds."""
    prefix, bench_ranks, section, _ = OUR_JOBS[which]
    return _launch(job_file(which, game), ranks or bench_ranks, name or f"atari-{prefix}-s{seed}",
                   [f"run.seed={seed}", f"{section}.test_episodes=0", f"env.envs_per_actor={ENVS_PER_RUNNER}",
                    "log.interval=1.0", *sets], wall, out)


def ours(which: str, game: str, seed: int, wall: float, out: Path) -> dict:
    """One run of ours and its counts over ``wall`` seconds from its first env step, its start-up apart."""
    run_dir, took = launch_ours(which, game, seed, wall, out)
    counts = OUR_JOBS[which][3](run_dir, wall)
    return {**counts, "start_seconds": _start_up(run_dir, counts["first_step"], took), "frameskip": FRAMESKIP}


REFERENCES = {  # name -> one seed's run: (env id, seed, wall) -> its JSON
    "Sample Factory APPO": lambda env_id, seed, wall: library("sample-factory", "sf_run.py",
                                                              [seed, BUDGET, wall, "inf", env_id], wall),
    "RLlib APPO": lambda env_id, seed, wall: library("rllib", "rllib_run.py",
                                                     ["appo", seed, BUDGET, wall, "inf", env_id], wall),
    "RLlib IMPALA": lambda env_id, seed, wall: library("rllib", "rllib_run.py",
                                                       ["impala", seed, BUDGET, wall, "inf", env_id], wall),
}


def frames_per_s(r: dict) -> float:
    return r["env_steps_sampled"] * r.get("frameskip", FRAMESKIP) / r["seconds"]


def trained_per_s(r: dict) -> float | None:
    if r.get("env_steps_trained") is None:
        return None
    return r["env_steps_trained"] / r["seconds"]


QUANTITIES = {  # name -> (unit, the value of one run's JSON or None where it is not known)
    "env frames/s collected": ("frames/s", frames_per_s),
    "samples/s trained (every pass)": ("samples/s", trained_per_s),
    "learner busy": ("share", lambda r: r.get("learner_busy")),
    "start-up to the first env step": ("s", lambda r: r.get("start_seconds")),
}


def rows_of(results: dict[str, list[dict]], game: str, wall: float) -> list[Row]:
    """Per quantity, ours (each of :data:`OURS` present) against every library and against the best one."""
    note = f"{GAMES[game]} 84x84x4, {wall:g} s of each side's own clock from its first env step, 2 runners of 8 games"
    ours = [o for o in OURS if o in results]
    libs = [name for name in results if name not in OURS]
    values = {q: {impl: [fn(r) for r in runs] for impl, runs in results.items()}
              for q, (_, fn) in QUANTITIES.items()}
    rows = []
    for q, (unit, _) in QUANTITIES.items():
        known = {impl: v for impl, v in values[q].items() if v and all(x is not None for x in v)}
        lower = q.startswith("start-up")
        for o in ours:
            if o not in known:
                continue
            if q in ("learner busy", "start-up to the first env step"):  # told, not a ratio with a target
                row = Row(f"Atari {game} {q}: {o}", unit, o, o, note=note)
                row.values = {impl: v for impl, v in known.items() if impl == o or impl in libs}
                rows.append(row)
                continue
            present = [lib for lib in libs if lib in known]
            for lib in present:
                row = Row(f"Atari {game} {q}: {o} vs {lib}", unit, o, lib, note=note, higher_is_better=not lower)
                row.values = {o: known[o], lib: known[lib]}
                rows.append(row)
            if present:
                best = max(present, key=lambda lib: statistics.median(known[lib]))
                row = Row(f"Atari {game} {q}: {o} vs the best library ({best})", unit, o, best, target=TARGET,
                          note=note)
                row.values = {o: known[o], best: known[best]}
                rows.append(row)
    return rows


def run(reps: int = MIN_REPS, wall: float = 60.0, game: str = "pong",
        references: tuple[str, ...] = tuple(REFERENCES), mine: tuple[str, ...] = OURS) -> list[Row]:
    """Per seed 1..reps, ours (IMPALA, PPO) then every reference, back to back, each for ``wall`` seconds. A
    library whose run fails is reported (stderr) and left out of the rows; ours failing fails the bench."""
    if game not in GAMES:
        raise ValueError(f"game: one of {', '.join(GAMES)}, got {game!r}")
    results: dict[str, list[dict]] = {**{o: [] for o in mine}, **{name: [] for name in references}}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, reps + 1):
            for o in mine:
                results[o].append(ours(o, game, seed, wall, Path(tmp)))
            for name in references:
                if name in failed:
                    continue
                try:
                    results[name].append(REFERENCES[name](GAMES[game], seed, wall))
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as err:
                    failed[name] = str(err)
                    print(f"mpirl bench atari: {name} left out: {err}", file=sys.stderr, flush=True)
            print(f"mpirl bench atari: seed {seed} of {reps} done", file=sys.stderr, flush=True)
    for name in failed:
        del results[name]
    if references and not any(name in results for name in references):
        raise RuntimeError(f"every library failed: {'; '.join(f'{k}: {v[:300]}' for k, v in failed.items())}")
    return rows_of(results, game, wall)


def main() -> None:
    """``python -m mpirl.bench.atari ours GAME SEED WALL``: one run of ours, its counts as a JSON line (a check)."""
    which, game, seed, wall = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    with tempfile.TemporaryDirectory() as tmp:
        for o in OURS:
            if which in ("ours", o):
                print(json.dumps({o: ours(o, game, seed, wall, Path(tmp))}), flush=True)


if __name__ == "__main__":
    main()
