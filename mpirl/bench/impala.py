"""IMPALA: wall time and env steps to CartPole-v1 mean return 475, mpirl's IMPALA vs Stable-Baselines3's PPO.

    mpirl bench impala [--reps 5]

Per seed, back to back on this machine: ``jobs/impala_cartpole.toml`` on 4 ranks (learner, one trajectory queue,
two actors of 8 games; asynchronous exchange), then SB3's ``PPO`` in one process with the RL Zoo's CartPole-v1
hyper-parameters (8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, GAE lambda 0.8, learning rate and clip
range linear from 1e-3 and 0.2 to 0). Both get ``--budget`` env steps and ``--wall`` seconds.

What is timed: the first episode after which the mean return of the last 20 episodes reached 475. Both count the
episodes they train on: each samples its actions from its current policy (no epsilon), so every actor's episodes
count for mpirl (its ``episodes`` tables, all actors), SB3's training episodes for SB3. Times run from the start of
learning: MPI start-up and imports excluded for mpirl (its job clock), imports and model construction for SB3. A
seed that never gets there within the budget counts as not reached (infinite time).

RLlib's APPO/IMPALA/PPO and Sample Factory's APPO are the other references the project's issue names; they are not
in this bench yet (docs/impala.md says what is and is not measured).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mpirl.bench.report import MIN_REPS, Row
from mpirl.bench.solve import crossing_rows, launch_run, reference_run, seed_pairs, watch

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "impala_cartpole.toml"
TARGET = 475.0
ZOO_PPO = dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0)
ZOO_ENVS, ZOO_LR, ZOO_CLIP = 8, 1e-3, 0.2


def ours(seed: int, budget: int, wall: float, out: Path) -> dict:
    from mpirl.metrics.summary import first_reach
    run_dir = launch_run(JOB, f"impala-s{seed}", [f"run.seed={seed}", f"run.target_return={TARGET}",
                                                  f"run.env_steps={budget}", f"run.wall_seconds={wall}"], wall, out)
    return {str(TARGET): first_reach(run_dir, TARGET)}


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


def run(reps: int = MIN_REPS, budget: int = 1_000_000, wall: float = 300.0) -> list[Row]:
    results = seed_pairs("impala", reps, ("mpirl IMPALA 4 ranks", lambda seed, out: ours(seed, budget, wall, out)),
                         ("SB3 PPO (zoo)", lambda seed: ppo(seed, budget, wall)))
    return crossing_rows(results, (TARGET,), "solve CartPole-v1 to {t:g}, policy gradient ({what})",
                         f"budget {budget:,} env steps, {wall:g} s")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ppo"]:
        ppo_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
