"""Solve: wall time and env steps to CartPole-v1 mean return 195 and 475, mpirl vs Stable-Baselines3 DQN.

    mpirl bench solve [--reps 5]

Per seed, back to back on this machine: ``jobs/cartpole_475.toml`` on 4 ranks
(learner, buffer, two actors; ``jobs/cartpole.toml`` with 32 trained samples per
inserted experience, as SB3 trains with the Zoo's settings; it stops once its least
exploring actor held 475), then SB3's ``DQN`` in one process with the RL Zoo's
CartPole-v1 hyper-parameters (lr 2.3e-3, batch 64, buffer 100,000, learning_starts
1,000, gamma 0.99, target update every 10 steps, train every 256 steps with 128
gradient steps: 32 trained samples per env step, epsilon to 0.04 over the first
8,000 steps, MLP 256x256). Both get ``--budget`` env steps (the Zoo's own budget is
50,000; epsilon's decay is kept at 8,000 steps).

What is timed: the first episode after which the mean return of the last 20
episodes reached the threshold, **counted on the same kind of episodes on both
sides**: training episodes played at SB3's final epsilon, 0.04. SB3 counts its own
training episodes. mpirl's two actors explore with Ape-X epsilons 0.4 ** (1 +
alpha i), and an actor playing 40 % random actions can never average 475, so mpirl
counts the episodes of its least exploring actor with ``apex.epsilon_alpha`` set so
that its epsilon is SB3's 0.04 (alpha 2.51; the job's own 7 would give it 0.0007,
an evaluator's near-greedy view that SB3's counted episodes never get), and the env
steps of both actors. **Each side's clock runs from its own first env step**: SB3's
from the start of ``learn`` (imports and model construction left out), mpirl's
from the earliest ``started_s`` of its actors on the job clock (imports, MPI
start-up, env and network construction left out). A seed that never reaches a
threshold within the budget counts as not reached (infinite time): a median over
seeds is then "not reached" when half or more missed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mpirl.bench.report import MIN_REPS, Row
from mpirl.launcher import find_mpiexec, launch_command

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "cartpole_475.toml"
THRESHOLDS = (195.0, 475.0)
ZOO = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
           target_update_interval=10, train_freq=256, gradient_steps=128, exploration_final_eps=0.04)
ZOO_STEPS, ZOO_EXPLORATION = 50_000, 0.16
# mpirl's counted actor explores as SB3's counted episodes do: 0.4 ** (1 + alpha) = 0.04.
EVAL_ALPHA = math.log(ZOO["exploration_final_eps"]) / math.log(0.4) - 1


def launch_run(job: Path, name: str, sets: list[str], wall: float, out: Path) -> Path:
    """Our job on 4 ranks, quiet, to its end (within ``wall`` seconds and some start-up): its run directory."""
    cmd, env = launch_command(find_mpiexec(), 4, str(job), [*sets, f'run.out_dir="{out}"', f'run.name="{name}"'], [])
    cmd.append("--quiet")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=wall + 180)
    if proc.returncode != 0:
        raise RuntimeError(f"mpirl {name} run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return sorted(out.glob(f"{name}-*/run.h5"))[-1].parent


def first_env_step(run_dir: Path) -> float:
    """When the run's first actor began stepping its games, on the job clock (the buffers' ``actors`` tables)."""
    import h5py
    import numpy as np
    started = []
    for path in run_dir.glob("buffer_*.h5"):
        with h5py.File(path, "r") as f:
            if "actors/started_s" in f:
                started += [float(s) for s in f["actors/started_s"][()] if np.isfinite(s)]
    if not started:
        raise RuntimeError(f"{run_dir}: no actor reported when it began")
    return min(started)


def from_first_step(reach: dict, first: float) -> dict:
    """A :func:`~mpirl.metrics.summary.first_reach` result with its seconds counted from ``first``."""
    return {**reach, "seconds": None if reach["seconds"] is None else reach["seconds"] - first}


def reference_run(module: str, flag: str, seed: int, budget: int, wall: float) -> dict:
    """``python -m module flag seed budget wall`` (a reference's run in its own process): the JSON it printed last."""
    from mpirl.bench import reference_process
    proc = reference_process.run([sys.executable, "-m", module, flag, str(seed), str(budget), str(wall)],
                                 timeout=wall + reference_process.START_ALLOWANCE)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {flag} run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ours(seed: int, budget: int, wall: float, out: Path) -> dict:
    from mpirl.metrics.summary import first_reach
    # The run stops once its least exploring actor held the higher threshold (or at the budget).
    run_dir = launch_run(JOB, f"solve-s{seed}", [f"run.seed={seed}", f"run.target_return={max(THRESHOLDS)}",
                                                 "run.return_from=least_exploring", f"run.env_steps={budget}",
                                                 f"run.wall_seconds={wall}", f"apex.epsilon_alpha={EVAL_ALPHA}"],
                         wall, out)
    evaluator = [3]  # world ranks 2 and 3 are the actors; the last explores least (epsilon 0.04, as SB3's)
    first = first_env_step(run_dir)
    return {str(t): from_first_step(first_reach(run_dir, t, actors=evaluator), first) for t in THRESHOLDS}


def sb3(seed: int, budget: int, wall: float) -> dict:
    return reference_run("mpirl.bench.solve", "--sb3", seed, budget, wall)


def watch(thresholds, wall: float):
    """An SB3 callback that records when the mean return of the last 20 training episodes first reached each of
    ``thresholds`` (seconds since training started, env steps, episodes) and stops once all are reached or after
    ``wall`` seconds. Its ``hits`` print as the JSON line the parent reads."""
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    class Watch(BaseCallback):
        def __init__(self):
            super().__init__()
            self.returns, self.hits = [], {}

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    self.returns.append(info["episode"]["r"])
                    if len(self.returns) >= 20:
                        mean = float(np.mean(self.returns[-20:]))
                        for t in thresholds:
                            if mean >= t and str(t) not in self.hits:
                                self.hits[str(t)] = {"seconds": time.perf_counter() - self.t0,
                                                     "env_steps": int(self.num_timesteps),
                                                     "episodes": len(self.returns)}
            return len(self.hits) < len(thresholds) and time.perf_counter() - self.t0 < wall

        def crossings(self) -> str:
            """The crossings, and the env steps sampled and the seconds they took (all of the run)."""
            none = {"seconds": None, "env_steps": None, "episodes": None}
            return json.dumps({**{str(t): self.hits.get(str(t), none) for t in thresholds},
                               "env_steps_sampled": int(self.num_timesteps), "episodes": len(self.returns),
                               "seconds": time.perf_counter() - self.t0})
    return Watch()


def sb3_main(seed: int, budget: int, wall: float) -> None:
    """One SB3 DQN run (in its own process); prints the crossings as one JSON line."""
    import gymnasium as gym
    from stable_baselines3 import DQN
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.monitor import Monitor

    env = Monitor(gym.make("CartPole-v1"))
    model = DQN("MlpPolicy", env, exploration_fraction=ZOO_EXPLORATION * ZOO_STEPS / budget,
                policy_kwargs=dict(net_arch=[256, 256]), seed=seed, device="cpu", verbose=0, **ZOO)
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default logger leaves a /tmp/SB3-* dir per run
    w = watch(THRESHOLDS, wall)
    model.learn(total_timesteps=budget, callback=w)
    print(w.crossings())


def seed_pairs(bench: str, reps: int, ours_run, ref_run) -> dict[str, list[dict]]:
    """``{ours name: [result per seed], reference name: [...]}``: per seed 1..reps, ours (``(name, run(seed,
    out_dir))``) then the SB3 reference (``(name, run(seed))``), back to back."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        raise RuntimeError(f"the {bench} benchmark needs Stable-Baselines3: pip install 'mpirl[bench]'") from None
    results: dict[str, list[dict]] = {ours_run[0]: [], ref_run[0]: []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, reps + 1):
            results[ours_run[0]].append(ours_run[1](seed, Path(tmp)))
            results[ref_run[0]].append(ref_run[1](seed))
    return results


def run(reps: int = MIN_REPS, budget: int = 100_000, wall: float = 100.0) -> list[Row]:
    results = seed_pairs("solve", reps, ("mpirl 4 ranks", lambda seed, out: ours(seed, budget, wall, out)),
                         ("SB3 DQN (zoo)", lambda seed: sb3(seed, budget, wall)))
    return crossing_rows(results, THRESHOLDS, "solve CartPole-v1 to {t:g} ({what})", f"budget {budget:,} env steps")


def crossing_rows(results: dict[str, list[dict]], thresholds, title: str, note: str) -> list[Row]:
    """Rows of the seconds and the env steps to each threshold, ours (``results``' first key) against the
    reference (its second), one value per seed; a seed that never got there counts as infinite and is named in
    the row's note. ``title`` is formatted with the threshold ``t`` and ``what`` is measured."""
    ours, ref = results
    rows = []
    for t in thresholds:
        for key, unit in (("seconds", "s"), ("env_steps", "env steps")):
            r = Row(title.format(t=t, what="wall time" if key == "seconds" else "env steps"), unit, ours, ref,
                    higher_is_better=False, target=1.0 if key == "seconds" else None)
            missed = []
            for impl, runs in results.items():
                r.values[impl] = [math.inf if res[str(t)][key] is None else float(res[str(t)][key]) for res in runs]
                missed += [f"{impl} seed {seed}" for seed, v in enumerate(r.values[impl], start=1) if v == math.inf]
            r.note = note + (f"; not reached: {', '.join(missed)}" if missed else "")
            rows.append(r)
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sb3"]:
        sb3_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
