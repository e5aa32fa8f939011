"""IMPALA: wall time and env steps to CartPole-v1 mean return 475, and the env steps/s collected on the way,
mpirl's IMPALA against the libraries users pick for actor-critic on many cores; then env steps/s collected and
trained on MinAtar Breakout against the asynchronous ones.

    mpirl bench impala [--reps 5] [--breakout-wall 60]      (--breakout-wall 0: the CartPole rows alone)

Per seed, back to back on this machine: ``jobs/impala_cartpole.toml`` on 4 ranks (learner, one trajectory queue,
two actors of 8 games; asynchronous exchange), then each reference in turn, every one with ``--budget`` env steps
and ``--wall`` seconds:

* SB3's ``PPO`` in one process with the RL Zoo's CartPole-v1 hyper-parameters (8 envs, n_steps 32, batch 256,
  20 epochs, gamma 0.98, GAE lambda 0.8, learning rate and clip range linear from 1e-3 and 0.2 to 0);
* RLlib 2.60's PPO, APPO and IMPALA (new API stack) with RLlib's own tuned CartPole settings, 2 env runners and the
  learner in the driver (``mpirl/bench/refs/rllib_run.py``);
* Sample Factory 2.1.1's APPO with its own CartPole example's settings, 2 rollout workers of 8 games
  (``mpirl/bench/refs/sf_run.py``).

RLlib and Sample Factory cannot live in the project's venv (they pin Gymnasium 1.2.2, and numpy < 2 with Gymnasium
< 1.0): each runs in a venv of its own that the bench makes on first use (:mod:`mpirl.bench.reference_venv`).

What is timed: the first episode after which the mean return of the last 20 episodes reached 475. Every
implementation counts the episodes it trains on: each samples its actions from its current policy (no epsilon), so
every actor's episodes count for mpirl (its ``episodes`` tables, all actors), the training episodes for the others
(SB3's Monitor; for RLlib and Sample Factory a Gymnasium wrapper in every worker that records each episode's end).
**Each side's clock runs from its own first env step**, its start-up reported apart: mpirl's from the earliest
``started_s`` of its actors on the job clock (imports, MPI start-up, env and network construction left out), SB3's
from the start of ``learn``, RLlib's and Sample Factory's from the first step any of their workers took (recorded
by ``refs/episode_file.py``; before this, Sample Factory's CartPole clock included its 15-30 s start-up while the
others excluded theirs). A seed that never gets there within the budget counts as not reached (infinite time). Env
steps/s is every env step sampled over the run's seconds (to the crossing, the budget or the wall). Every side plays
8 games per runner (RLlib's env runners too; before this, RLlib played 1 on CartPole). Learner env steps/s is every
env step the learner trained on over the same seconds, **every pass counted** (ours: trajectories x unroll, each
once; RLlib's APPO's and IMPALA's lifetime counts, each circular-buffer pass; Sample Factory's consumed samples x
its epochs; RLlib's PPO counts every minibatch pass of every epoch, and SB3's is not read, so those rows are left
out).

MinAtar Breakout (``MinAtar/Breakout-v1``: 10x10 planes, 4 channels, 3 actions, sticky actions 0.1) follows the
CartPole rows in the same command (``--breakout-wall 0`` leaves it out): per seed, back to back,
``jobs/impala_minatar_breakout.toml`` on its 4 ranks (2 actors of 8 games; MinAtar's network: Conv 16x3x3, a shared
128-wide layer, linear policy and value heads), then RLlib's APPO and IMPALA (``rllib_run.py ...
MinAtar/Breakout-v1``: RLlib's Atari example settings, 2 env runners of 8 games, the learner in the driver; Conv
16x3x3 then 128 units in each head) and Sample Factory's APPO (``sf_run.py ... MinAtar/Breakout-v1``: its Atari
settings, asynchronous, 2 workers of 8 games; Conv 16x3x3, 128, linear heads), each for ``--breakout-wall`` seconds
(default 60; no target; the references' budget of 10M env steps is never reached), the references being those of
``references`` that have a Breakout run (SB3 has none here). RLlib and Sample Factory play the game through
``refs/minatar_env.py``: MinAtar's own, with the same defaults. Rows: env steps/s collected, ours against each
(counted as for CartPole), and learner env steps/s trained, ours against each, every pass counted: ours
trajectories x unroll, each once; RLlib's lifetime count, each pass (APPO trains a batch up to twice from its
circular buffer, IMPALA once); Sample Factory's learner's consumed samples x its 4 epochs, when the stop was asked.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from mpirl.bench.report import MIN_REPS, Row
from mpirl.bench.solve import crossing_rows, first_env_step, from_first_step, launch_run, reference_run, watch

ROOT = Path(__file__).resolve().parents[2]
REFS = Path(__file__).resolve().parent / "refs"
JOB = ROOT / "jobs" / "impala_cartpole.toml"
BREAKOUT_JOB = ROOT / "jobs" / "impala_minatar_breakout.toml"
BREAKOUT = "MinAtar/Breakout-v1"
BREAKOUT_BUDGET = 10_000_000  # the references' (their Atari examples' budget): a wall of minutes never reaches it
NO_TARGET = float("inf")  # the reference scripts' target for a run that takes its wall
TARGET = 475.0
ZOO_PPO = dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0)
ZOO_ENVS, ZOO_LR, ZOO_CLIP = 8, 1e-3, 0.2


OURS = "mpirl IMPALA 4 ranks"


def ours(seed: int, budget: int, wall: float, out: Path) -> dict:
    from mpirl.metrics.summary import first_reach
    run_dir = launch_run(JOB, f"impala-s{seed}", [f"run.seed={seed}", f"run.target_return={TARGET}",
                                                  f"run.env_steps={budget}", f"run.wall_seconds={wall}"], wall, out)
    return {str(TARGET): from_first_step(first_reach(run_dir, TARGET), first_env_step(run_dir)), **counts(run_dir)}


def counts(run_dir: Path) -> dict:
    """Our run's env steps collected and trained (trajectories x unroll) by its learner's last ``train`` row, and
    that row's seconds from its actors' first env step. A run whose learner trained nothing (a wall used up by the
    start-up) is an error that says so, not a rate of zero."""
    import h5py
    with h5py.File(run_dir / "run.h5", "r") as f:
        t = f["learner/train"]
        if len(t["env_steps"]) == 0:
            raise RuntimeError(f"{run_dir}: our learner trained nothing before its stop "
                               f"({f['learner'].attrs.get('stop_reason', 'no stop reason')}); its wall counts from "
                               f"its start, the ranks' start-up inside it: give it a longer wall")
        steps, seconds = int(t["env_steps"][-1]), float(t["time"][-1]) - first_env_step(run_dir)
        trained = int(t["samples_trained"][-1]) * int(f["learner"].attrs["unroll"])  # trajectories x their steps
    return {"env_steps_sampled": steps, "env_steps_trained": trained, "seconds": seconds}


def ours_breakout(seed: int, budget: int, wall: float, out: Path) -> dict:
    """``jobs/impala_minatar_breakout.toml`` to ``budget`` env steps or for ``wall`` seconds (it has no target)."""
    return counts(launch_run(BREAKOUT_JOB, f"impala-breakout-s{seed}", [f"run.seed={seed}", f"run.env_steps={budget}",
                                                                         f"run.wall_seconds={wall}"], wall, out))


def ppo(seed: int, budget: int, wall: float) -> dict:
    return reference_run("mpirl.bench.impala", "--ppo", seed, budget, wall)


def ppo_main(seed: int, budget: int, wall: float) -> None:
    """One SB3 PPO run (in its own process); prints the crossing as one JSON line."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger

    env = make_vec_env("CartPole-v1", n_envs=ZOO_ENVS, seed=seed)  # each env in a Monitor: episode returns
    model = PPO("MlpPolicy", env, learning_rate=lambda left: ZOO_LR * left, clip_range=lambda left: ZOO_CLIP * left,
                seed=seed, device="cpu", verbose=0, **ZOO_PPO)
    model.set_logger(Logger(folder=None, output_formats=[]))
    w = watch((TARGET,), wall)
    model.learn(total_timesteps=budget, callback=w)
    print(w.crossings())


def library(venv: str, script: str, args: list, wall: float, env: dict | None = None) -> dict:
    """One run of a reference script of ``refs/`` in its reference venv, in a session of its own (what it started
    is gone when it ends: :mod:`mpirl.bench.reference_process`): the JSON line it printed last. ``env``: variables
    added to this process's environment for the run."""
    from mpirl.bench import reference_process
    from mpirl.bench.reference_venv import python_of
    python = python_of(venv, log=lambda line: print(line, file=sys.stderr, flush=True))
    proc = reference_process.run([str(python), str(REFS / script), *map(str, args)],
                                 timeout=wall + reference_process.START_ALLOWANCE, cwd=tempfile.gettempdir(),
                                 env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(map(str, args))} failed (exit {proc.returncode}): "
                           f"{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


REFERENCES = {  # name -> one seed's run: (seed, budget, wall) -> its JSON
    "SB3 PPO (zoo)": ppo,
    "RLlib PPO": lambda seed, budget, wall: library("rllib", "rllib_run.py", ["ppo", seed, budget, wall, TARGET],
                                                    wall),
    "RLlib APPO": lambda seed, budget, wall: library("rllib", "rllib_run.py",
                                                     ["appo", seed, budget, wall, TARGET], wall),
    "RLlib IMPALA": lambda seed, budget, wall: library("rllib", "rllib_run.py",
                                                       ["impala", seed, budget, wall, TARGET], wall),
    "Sample Factory APPO": lambda seed, budget, wall: library("sample-factory", "sf_run.py",
                                                              [seed, budget, wall, TARGET], wall),
}


BREAKOUT_REFERENCES = {  # name -> one seed's run on MinAtar Breakout: (seed, budget, wall) -> its JSON
    "RLlib APPO": lambda seed, budget, wall: library("rllib", "rllib_run.py",
                                                     ["appo", seed, budget, wall, NO_TARGET, BREAKOUT], wall),
    "RLlib IMPALA": lambda seed, budget, wall: library("rllib", "rllib_run.py",
                                                       ["impala", seed, budget, wall, NO_TARGET, BREAKOUT], wall),
    "Sample Factory APPO": lambda seed, budget, wall: library("sample-factory", "sf_run.py",
                                                              [seed, budget, wall, NO_TARGET, BREAKOUT], wall),
}


def learner_rate(result: dict) -> float | None:
    """A run's learner env steps/s, every pass counted: its count over its seconds; None where the library's count
    is not read."""
    if result.get("env_steps_trained") is not None:
        return result["env_steps_trained"] / result["seconds"]
    return None


def breakout(reps: int = MIN_REPS, wall: float = 60.0,
             references: tuple[str, ...] = tuple(BREAKOUT_REFERENCES), budget: int = BREAKOUT_BUDGET) -> list[Row]:
    """Per seed, ours then every reference on MinAtar Breakout for ``wall`` seconds or to ``budget`` env steps,
    whichever comes first (by default the wall: a wall of minutes never reaches the budget), back to back; per
    reference, rows of the env steps/s collected and (where the library's count is read) trained, ours against it.
    A budget reached first makes the length of each side's run an event rather than a time: the wall is then a
    deadline, as a test wants on a machine of any load."""
    results: dict[str, list[dict]] = {OURS: [], **{name: [] for name in references}}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, reps + 1):
            results[OURS].append(ours_breakout(seed, budget, wall, Path(tmp)))
            for name in references:
                results[name].append(BREAKOUT_REFERENCES[name](seed, budget, wall))
    note = f"{BREAKOUT}, {wall:g} s wall" + (f" or {budget:,} env steps" if budget != BREAKOUT_BUDGET else "")
    counted = {OURS: "ours each trajectory step once", "RLlib APPO": "RLlib APPO each pass (up to 2 per batch)",
               "RLlib IMPALA": "RLlib IMPALA each pass (1 per batch)",
               "Sample Factory APPO": "Sample Factory each pass (4 epochs)"}
    rows = []
    for name in references:
        pair = {OURS: results[OURS], name: results[name]}
        rate = Row(f"MinAtar Breakout env steps/s collected vs {name}", "env steps/s", OURS, name, target=1.0,
                   note=note)
        for impl, runs in pair.items():
            rate.values[impl] = [r["env_steps_sampled"] / r["seconds"] for r in runs]
        rows.append(rate)
        learned = [learner_rate(r) for r in results[name]]
        if all(v is not None for v in learned):
            row = Row(f"MinAtar Breakout learner env steps/s trained vs {name}", "env steps/s", OURS, name,
                      target=1.0, note=f"{note}; counted: {counted[OURS]}, {counted[name]}")
            row.values = {OURS: [learner_rate(r) for r in results[OURS]], name: learned}
            rows.append(row)
    return rows


def run(reps: int = MIN_REPS, budget: int = 1_000_000, wall: float = 300.0,
        references: tuple[str, ...] = tuple(REFERENCES), breakout_wall: float = 60.0,
        breakout_steps: int | None = None) -> list[Row]:
    """Per seed, ours then every reference, back to back; per reference, rows of the seconds and the env steps to
    475 and of the env steps/s collected, ours against it. Then, unless ``breakout_wall`` is 0, the MinAtar Breakout
    rows (:func:`breakout`) against those of ``references`` that have a Breakout run, each side to
    ``breakout_steps`` env steps or the wall, whichever comes first (None: the wall alone)."""
    results: dict[str, list[dict]] = {OURS: [], **{name: [] for name in references}}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, reps + 1):
            results[OURS].append(ours(seed, budget, wall, Path(tmp)))
            for name in references:
                results[name].append(REFERENCES[name](seed, budget, wall))
    note = f"budget {budget:,} env steps, {wall:g} s"
    rows = []
    for name in references:
        pair = {OURS: results[OURS], name: results[name]}
        rows += crossing_rows(pair, (TARGET,), "solve CartPole-v1 to {t:g} vs " + name + " ({what})", note)
        rate = Row(f"env steps/s collected on the way vs {name}", "env steps/s", OURS, name, target=1.0,
                   note=note)
        for impl, runs in pair.items():
            rate.values[impl] = [r["env_steps_sampled"] / r["seconds"] for r in runs]
        rows.append(rate)
        if all(r.get("env_steps_trained") is not None for r in results[name]):  # SB3's is not read
            learned = Row(f"learner env steps/s trained vs {name}", "env steps/s", OURS, name, target=1.0,
                          note=note + "; every pass counted")
            for impl, runs in pair.items():
                learned.values[impl] = [r["env_steps_trained"] / r["seconds"] for r in runs]
            rows.append(learned)
    on_breakout = tuple(name for name in references if name in BREAKOUT_REFERENCES)
    if breakout_wall > 0 and on_breakout:
        rows += breakout(reps, breakout_wall, on_breakout, budget=breakout_steps or BREAKOUT_BUDGET)
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ppo"]:
        ppo_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
