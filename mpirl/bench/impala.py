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

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from mpirl.bench.report import MIN_REPS, Row
from mpirl.launcher import find_mpiexec, launch_command

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "impala_cartpole.toml"
TARGET = 475.0
ZOO_PPO = dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0)
ZOO_ENVS, ZOO_LR, ZOO_CLIP = 8, 1e-3, 0.2


def ours(seed: int, budget: int, wall: float, out: Path) -> dict:
    from mpirl.metrics.summary import first_reach
    sets = [f"run.seed={seed}", f"run.target_return={TARGET}", f"run.env_steps={budget}", f"run.wall_seconds={wall}",
            f'run.out_dir="{out}"', f'run.name="impala-s{seed}"']
    cmd, env = launch_command(find_mpiexec(), 4, str(JOB), sets, [])
    cmd.append("--quiet")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=wall + 180)
    if proc.returncode != 0:
        raise RuntimeError(f"mpirl IMPALA run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    run_dir = sorted(out.glob(f"impala-s{seed}-*/run.h5"))[-1].parent
    return {str(TARGET): first_reach(run_dir, TARGET)}


def ppo(seed: int, budget: int, wall: float) -> dict:
    proc = subprocess.run([sys.executable, "-m", "mpirl.bench.impala", "--ppo", str(seed), str(budget), str(wall)],
                          capture_output=True, text=True, timeout=wall + 180)
    if proc.returncode != 0:
        raise RuntimeError(f"SB3 PPO run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ppo_main(seed: int, budget: int, wall: float) -> None:
    """One SB3 PPO run (in its own process); prints the crossing as one JSON line."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger

    from mpirl.bench.solve import watch
    env = make_vec_env("CartPole-v1", n_envs=ZOO_ENVS, seed=seed)  # each env in a Monitor: episode returns
    model = PPO("MlpPolicy", env, learning_rate=lambda left: ZOO_LR * left, clip_range=lambda left: ZOO_CLIP * left,
                seed=seed, device="cpu", verbose=0, **ZOO_PPO)
    model.set_logger(Logger(folder=None, output_formats=[]))
    w = watch((TARGET,), wall)
    model.learn(total_timesteps=budget, callback=w)
    print(w.crossings())


def run(reps: int = MIN_REPS, budget: int = 1_000_000, wall: float = 300.0) -> list[Row]:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        raise RuntimeError("the impala benchmark needs Stable-Baselines3: pip install 'mpirl[bench]'") from None
    ours_name, ref = "mpirl IMPALA 4 ranks", "SB3 PPO (zoo)"
    results: dict[str, list[dict]] = {ours_name: [], ref: []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, reps + 1):
            results[ours_name].append(ours(seed, budget, wall, Path(tmp)))
            results[ref].append(ppo(seed, budget, wall))
    rows = []
    for key in ("seconds", "env_steps"):
        r = Row(f"solve CartPole-v1 to {TARGET:g}, policy gradient ({'wall time' if key == 'seconds' else 'env steps'})",
                "s" if key == "seconds" else "env steps", ours_name, ref, higher_is_better=False,
                target=1.0 if key == "seconds" else None)
        missed = []
        for impl, runs in results.items():
            r.values[impl] = [math.inf if res[str(TARGET)][key] is None else float(res[str(TARGET)][key])
                              for res in runs]
            missed += [f"{impl} seed {seed}" for seed, v in enumerate(r.values[impl], start=1) if v == math.inf]
        r.note = f"budget {budget:,} env steps, {wall:g} s" + (f"; not reached: {', '.join(missed)}" if missed else "")
        rows.append(r)
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ppo"]:
        ppo_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
