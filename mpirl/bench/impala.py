"""IMPALA: wall time and env steps to CartPole-v1 mean return 475, and the env steps/s collected on the way,
mpirl's IMPALA against the libraries users pick for actor-critic on many cores.

    mpirl bench impala [--reps 5]

Per seed, back to back on this machine: ``jobs/impala_cartpole.toml`` on 4 ranks (learner, one trajectory queue,
two actors of 8 games; asynchronous exchange), then each reference in turn, every one with ``--budget`` env steps
and ``--wall`` seconds:

* SB3's ``PPO`` in one process with the RL Zoo's CartPole-v1 hyper-parameters (8 envs, n_steps 32, batch 256,
  20 epochs, gamma 0.98, GAE lambda 0.8, learning rate and clip range linear from 1e-3 and 0.2 to 0);
* RLlib 2.60's PPO, APPO and IMPALA (new API stack) with RLlib's own tuned CartPole settings, 2 env runners and the
  learner in the driver (``mpirl/bench/refs/rllib_cartpole.py``);
* Sample Factory 2.1.1's APPO with its own CartPole example's settings, 2 rollout workers of 8 games
  (``mpirl/bench/refs/sf_cartpole.py``).

RLlib and Sample Factory cannot live in the project's venv (they pin Gymnasium 1.2.2, and numpy < 2 with Gymnasium
< 1.0): each runs in a venv of its own that the bench makes on first use (:mod:`mpirl.bench.reference_venv`).

What is timed: the first episode after which the mean return of the last 20 episodes reached 475. Every
implementation counts the episodes it trains on: each samples its actions from its current policy (no epsilon), so
every actor's episodes count for mpirl (its ``episodes`` tables, all actors), the training episodes for the others
(SB3's Monitor; for RLlib and Sample Factory a Gymnasium wrapper in every worker that records each episode's end).
Times run from the start of learning: MPI start-up and imports excluded for mpirl (its job clock), imports and model
construction for SB3 and RLlib (``ray.init`` and ``build_algo``); Sample Factory builds its workers inside the
process the clock starts with. A seed that never gets there within the budget counts as not reached (infinite
time). Env steps/s is every env step sampled over the run's seconds (to the crossing, the budget or the wall);
for Sample Factory, the steps of the episodes that finished. Learner env steps/s is every env step the learner
trained on over the same seconds, each pass counted (ours: trajectories x unroll; RLlib's APPO's and IMPALA's
lifetime counts; RLlib's PPO counts every minibatch pass of every epoch, and SB3's and Sample Factory's are not
read, so those rows are left out).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from mpirl.bench.report import MIN_REPS, Row
from mpirl.bench.solve import crossing_rows, launch_run, reference_run, watch

ROOT = Path(__file__).resolve().parents[2]
REFS = Path(__file__).resolve().parent / "refs"
JOB = ROOT / "jobs" / "impala_cartpole.toml"
TARGET = 475.0
ZOO_PPO = dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0)
ZOO_ENVS, ZOO_LR, ZOO_CLIP = 8, 1e-3, 0.2


OURS = "mpirl IMPALA 4 ranks"


def ours(seed: int, budget: int, wall: float, out: Path) -> dict:
    import h5py
    from mpirl.metrics.summary import first_reach
    run_dir = launch_run(JOB, f"impala-s{seed}", [f"run.seed={seed}", f"run.target_return={TARGET}",
                                                  f"run.env_steps={budget}", f"run.wall_seconds={wall}"], wall, out)
    with h5py.File(run_dir / "run.h5", "r") as f:
        t = f["learner/train"]
        steps, seconds = int(t["env_steps"][-1]), float(t["time"][-1])
        trained = int(t["samples_trained"][-1]) * int(f["learner"].attrs["unroll"])  # trajectories x their steps
    return {str(TARGET): first_reach(run_dir, TARGET), "env_steps_sampled": steps, "env_steps_trained": trained,
            "seconds": seconds}


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


def library(venv: str, script: str, args: list, wall: float) -> dict:
    """One run of a reference script of ``refs/`` in its reference venv: the JSON line it printed last."""
    from mpirl.bench.reference_venv import python_of
    python = python_of(venv, log=lambda line: print(line, file=sys.stderr, flush=True))
    proc = subprocess.run([str(python), str(REFS / script), *map(str, args)], capture_output=True, text=True,
                          timeout=wall + 300, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(map(str, args))} failed (exit {proc.returncode}): "
                           f"{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


REFERENCES = {  # name -> one seed's run: (seed, budget, wall) -> its JSON
    "SB3 PPO (zoo)": ppo,
    "RLlib PPO": lambda seed, budget, wall: library("rllib", "rllib_cartpole.py", ["ppo", seed, budget, wall, TARGET],
                                                    wall),
    "RLlib APPO": lambda seed, budget, wall: library("rllib", "rllib_cartpole.py",
                                                     ["appo", seed, budget, wall, TARGET], wall),
    "RLlib IMPALA": lambda seed, budget, wall: library("rllib", "rllib_cartpole.py",
                                                       ["impala", seed, budget, wall, TARGET], wall),
    "Sample Factory APPO": lambda seed, budget, wall: library("sample-factory", "sf_cartpole.py",
                                                              [seed, budget, wall, TARGET], wall),
}


def run(reps: int = MIN_REPS, budget: int = 1_000_000, wall: float = 300.0,
        references: tuple[str, ...] = tuple(REFERENCES)) -> list[Row]:
    """Per seed, ours then every reference, back to back; per reference, rows of the seconds and the env steps to
    475 and of the env steps/s collected, ours against it."""
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
        if all(r.get("env_steps_trained") is not None for r in results[name]):  # Sample Factory's is not read
            learned = Row(f"learner env steps/s trained vs {name}", "env steps/s", OURS, name, target=1.0,
                          note=note + "; every pass counted")
            for impl, runs in pair.items():
                learned.values[impl] = [r["env_steps_trained"] / r["seconds"] for r in runs]
            rows.append(learned)
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ppo"]:
        ppo_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
