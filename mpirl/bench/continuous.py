"""Continuous actions and PPO against Stable-Baselines3's PPO with the RL Zoo's settings, one run at a time:

    mpirl bench continuous [--reps 5] [--tasks pendulum,cartpole,hopper,halfcheetah,novelocity]

Per seed (1 .. reps), back to back on this machine, ours then SB3's, each in a process of its own started by this
one:

* **Pendulum-v1 to -200** (``pendulum``): ``jobs/pendulum_ppo.toml`` (allreduce PPO, 2 workers of 4 games, a
  Gaussian policy) against SB3's PPO with the Zoo's Pendulum settings (4 envs, n_steps 1024, gamma 0.9, GAE 0.95,
  10 epochs, lr 1e-3, clip 0.2, gSDE resampled every 4 steps), both stopping once the mean return of their last 20
  training episodes reaches -200 (budget 1,000,000 env steps): seconds and env steps to it.
* **CartPole-v1 to 475 from launch** (``cartpole``): ours, each of ``jobs/a3c_cartpole.toml`` (async A2C, 5 ranks),
  ``jobs/impala_cartpole.toml`` (4 ranks), the allreduce PPO variant of the a3c job (the learning test's) and
  ``jobs/ppo_cartpole.toml`` (allreduce PPO with the Zoo's settings, 2 workers of 4 games), against SB3's PPO with
  the Zoo's CartPole
  settings (8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, GAE 0.8, lr and clip linear to 0): seconds from
  launch (this process starting the run's process) to the last-20 mean of 475.
* **Hopper-v5 and HalfCheetah-v5, 1,000,000 env steps** (``hopper``, ``halfcheetah``): ``jobs/ppo_hopper.toml`` and
  ``jobs/ppo_halfcheetah.toml`` (allreduce PPO, 2 workers of 1 game, the Zoo's settings split over the two) against
  SB3's PPO with the Zoo's settings (``VecNormalize`` of observations and rewards, 1 env): the deterministic
  policy's mean return over 10 episodes at the end (ours: the final test round, the Gaussian's means; SB3:
  ``evaluate_policy(deterministic=True)`` on the frozen normalisation) and the seconds from launch to the end of
  training (each side's evaluation left out).
* **Recurrence on CartPole with its velocities hidden** (``novelocity``, ours only):
  ``jobs/ppo_cartpole_novelocity.toml`` and ``jobs/impala_cartpole_novelocity.toml`` with their LSTM core, the same
  jobs with ``agent.recurrent = "none"`` (the feed-forward policy with the same settings), and the IMPALA job's
  LSTM served by an inference worker
  (``topology.workers = 1``): each stopping at a last-20 mean of 475 or after its family's budget of env steps
  (``NOVELOCITY_BUDGET``: the same for the LSTM and the feed-forward policy); the
  best last-20 mean each reached (of every training episode, in the order they were recorded) and the seconds from
  launch to 475, the LSTM against the feed-forward policy.

The clocks: both sides start when this process starts the run's process, so both include their imports and start-up
(ours: ``mpiexec`` and the ranks' imports). SB3's crossing is ``time.time()`` in its callback; ours is the process's
exit (the job stops at the crossing) less its final test round: the ranks' shutdown stays in ours. Episodes
counted: every training episode, on both sides (both sample their actions), in the order they reach whoever
decides (SB3's callback; our stop's rank).
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
TASKS = ("pendulum", "cartpole", "hopper", "halfcheetah", "novelocity")
# Runs of many minutes a seed, which the comparisons measure at 3 seeds: --reps 3 is accepted for these alone.
LONG_TASKS = ("hopper", "halfcheetah", "novelocity")
PENDULUM_TARGET, CARTPOLE_TARGET = -200.0, 475.0
BUDGET = 1_000_000
WALL = 3600.0
# The RL Zoo's PPO hyper-parameters (rl-baselines3-zoo hyperparams/ppo.yml).
ZOO = {
    "Pendulum-v1": dict(n_envs=4, normalize=False, kwargs=dict(n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10,
                                                               ent_coef=0.0, learning_rate=1e-3, clip_range=0.2,
                                                               use_sde=True, sde_sample_freq=4)),
    "CartPole-v1": dict(n_envs=8, normalize=False, kwargs=dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                                                               n_epochs=20, ent_coef=0.0), linear=(1e-3, 0.2)),
    "Hopper-v5": dict(n_envs=1, normalize=True, kwargs=dict(batch_size=32, n_steps=512, gamma=0.999,
                                                            learning_rate=9.80828e-05, ent_coef=0.00229519,
                                                            clip_range=0.2, n_epochs=5, gae_lambda=0.99,
                                                            max_grad_norm=0.7, vf_coef=0.835671),
                      policy=dict(log_std_init=-2, ortho_init=False, net_arch=dict(pi=[256, 256], vf=[256, 256]))),
    "HalfCheetah-v5": dict(n_envs=1, normalize=True, kwargs=dict(batch_size=64, n_steps=512, gamma=0.98,
                                                                 learning_rate=2.0633e-05, ent_coef=0.000401762,
                                                                 clip_range=0.1, n_epochs=20, gae_lambda=0.92,
                                                                 max_grad_norm=0.8, vf_coef=0.58096),
                           policy=dict(log_std_init=-2, ortho_init=False, net_arch=dict(pi=[256, 256], vf=[256, 256]))),
}
# Each family's budget of env steps, the same for its LSTM and its feed-forward policy: PPO's ten-fold reuse of each
# step needs far fewer than IMPALA's one pass (its LSTM job reached 475 after 580 k on seed 1).
NOVELOCITY_BUDGET = {"PPO": 500_000, "IMPALA": 2_000_000}
NOVELOCITY_JOBS = {"LSTM PPO": ("ppo_cartpole_novelocity.toml", 2, []),
                   "feed-forward PPO": ("ppo_cartpole_novelocity.toml", 2, ['agent.recurrent="none"']),
                   "LSTM IMPALA": ("impala_cartpole_novelocity.toml", 4, []),
                   "feed-forward IMPALA": ("impala_cartpole_novelocity.toml", 4, ['agent.recurrent="none"']),
                   "LSTM IMPALA, inference worker": ("impala_cartpole_novelocity.toml", 5, ["topology.workers=1"])}
CARTPOLE_JOBS = {"mpirl a3c async A2C": ("a3c_cartpole.toml", 5, []),
                 "mpirl IMPALA": ("impala_cartpole.toml", 4, []),
                 "mpirl allreduce PPO": ("a3c_cartpole.toml", 4, ['a3c.exchange="allreduce"', 'a3c.loss="ppo"',
                                                                  "a3c.epochs=2", "a3c.minibatches=2",
                                                                  "a3c.gae_lambda=0.95", "a3c.sync_frac=1.0"]),
                 "mpirl PPO zoo settings": ("ppo_cartpole.toml", 2, [])}


# --------------------------------------------------------------------------- ours


def _launch(job: str, n: int, sets: list[str], out: Path, name: str) -> tuple[Path, float]:
    """Our job to its end: its run directory and the seconds from the launch to the process's exit."""
    cmd, env = launch_command(find_mpiexec(), n, str(ROOT / "jobs" / job),
                              [*sets, f'run.out_dir="{out}"', f'run.name="{name}"'], [])
    cmd.append("--quiet")
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=WALL + 600)
    seconds = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"mpirl {name} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return sorted(out.glob(f"{name}-*/run.h5"))[-1].parent, seconds


def _final_counts(run_dir: Path) -> tuple[float, int]:
    """The seconds the run's final test round took (after its stop) and the env steps the job had played at the stop:
    the gradient family's ``updates`` file, IMPALA's learner's."""
    import h5py
    for name, test, counts in (("updates.h5", "test", "updates"), ("learner.h5", "test", "train")):
        if (run_dir / name).exists():
            with h5py.File(run_dir / name, "r", locking=False) as f:
                seconds = float(f[test]["seconds"][-1]) if len(f[test]["seconds"]) else 0.0
                return seconds, int(f[counts]["env_steps"][-1])
    raise RuntimeError(f"{run_dir}: neither updates.h5 nor learner.h5")


def ours_crossing(job: str, n: int, sets: list[str], target: float, seed: int, out: Path, name: str) -> dict:
    """Our run stopping at ``target``: seconds from launch and env steps to it (None: not reached). The job decides
    the crossing, as SB3's callback does, over every training episode as it reaches the rank that decides; its
    final test round, after the stop, is left out of the seconds."""
    import h5py
    run_dir, seconds = _launch(job, n, [*sets, f"run.seed={seed}", f"run.target_return={target}",
                                        f"run.env_steps={BUDGET}", f"run.wall_seconds={WALL}"], out,
                               f"{name}-s{seed}")
    with h5py.File(run_dir / "run.h5", "r") as f:
        reached = "reached" in str(f.attrs["stop_reason"]) and "env_steps" not in str(f.attrs["stop_reason"])
    if not reached:
        return {"seconds": None, "env_steps": None}
    test_seconds, env_steps = _final_counts(run_dir)
    return {"seconds": seconds - test_seconds, "env_steps": env_steps}


def ours_final(job: str, seed: int, out: Path) -> dict:
    """Our run of ``BUDGET`` env steps: the final test round's mean return and the seconds from launch to the end of
    training (the process's exit less the test round)."""
    import h5py
    run_dir, seconds = _launch(job, 2, [f"run.seed={seed}", f"run.env_steps={BUDGET}"], out, f"final-s{seed}")
    with h5py.File(run_dir / "run.h5", "r") as f:
        test = f["updates/test"]
        return {"return": float(test["return_mean"][-1]), "seconds": seconds - float(test["seconds"][-1])}


def novelocity_budget(name: str) -> int:
    return NOVELOCITY_BUDGET["IMPALA" if "IMPALA" in name else "PPO"]


def best_window_mean(run_dir: Path, window: int = 20) -> float:
    """The best mean return of ``window`` training episodes in a row, every rank's episode rows in time order."""
    from mpirl.metrics.run_file import load_run
    from mpirl.metrics.summary import in_time_order, window_means
    files = load_run(run_dir)["files"]
    _, ret = in_time_order([e["tables"].get("episodes", {}) for e in files.values()], "return")
    return float(window_means(ret.astype(float), window).max()) if len(ret) >= window else math.nan


def ours_novelocity(job: str, n: int, sets: list[str], seed: int, out: Path, name: str, budget: int) -> dict:
    """A masked-CartPole run to 475 or ``budget`` env steps: seconds from launch to 475 (None: not reached; its
    final test round left out) and the best last-20 mean it reached."""
    import h5py
    run_dir, seconds = _launch(job, n, [*sets, f"run.seed={seed}", f"run.target_return={CARTPOLE_TARGET}",
                                        f"run.env_steps={budget}", f"run.wall_seconds={WALL}"], out,
                               f"{name}-s{seed}")
    with h5py.File(run_dir / "run.h5", "r") as f:
        reason = str(f.attrs["stop_reason"])
    reached = "reached" in reason and "env_steps" not in reason
    return {"seconds": seconds - _final_counts(run_dir)[0] if reached else None, "best": best_window_mean(run_dir)}


def _novelocity_rows(results: dict[str, list[dict]]) -> list[Row]:
    rows = []
    for lstm, ff in (("LSTM PPO", "feed-forward PPO"), ("LSTM IMPALA", "feed-forward IMPALA"),
                     ("LSTM IMPALA, inference worker", "feed-forward IMPALA")):
        if lstm not in results or ff not in results:
            continue
        a, b = f"mpirl {lstm}", f"mpirl {ff}"
        reached = [sum(r["seconds"] is not None for r in results[k]) for k in (lstm, ff)]
        note = (f"budget {novelocity_budget(lstm):,} env steps; reached {CARTPOLE_TARGET:g}: {lstm} {reached[0]} of "
                f"{len(results[lstm])} seeds, {ff} {reached[1]} of {len(results[ff])}")
        best = Row(f"CartPoleNoVelocity-v1: best last-20 mean, {lstm} vs {ff}", "return", a, b, note=note)
        sec = Row(f"CartPoleNoVelocity-v1: seconds from launch to {CARTPOLE_TARGET:g}, {lstm} vs {ff}", "s", a, b,
                  higher_is_better=False, note=note)
        for impl, key in ((a, lstm), (b, ff)):
            best.values[impl] = [r["best"] for r in results[key]]
            sec.values[impl] = [math.inf if r["seconds"] is None else r["seconds"] for r in results[key]]
        rows += [best, sec]
    return rows


# --------------------------------------------------------------------------- SB3 (each run in its own process)


def sb3_run(env_id: str, seed: int, target: float) -> dict:
    """``python -m mpirl.bench.continuous --sb3 ENV SEED TARGET T0``: its JSON line (T0: the launch, epoch seconds)."""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "mpirl.bench.continuous", "--sb3", env_id, str(seed), str(target),
                           repr(t0)], capture_output=True, text=True, timeout=WALL + 600)
    if proc.returncode != 0:
        raise RuntimeError(f"SB3 PPO on {env_id} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sb3_main(env_id: str, seed: int, target: float, t0: float) -> None:
    """SB3's PPO with the Zoo's settings for ``env_id``: to ``target`` (a last-20 mean; nan: the whole budget, then
    the deterministic policy's mean return over 10 episodes). Prints one JSON line."""
    import numpy as np
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecNormalize
    zoo = ZOO[env_id]
    env = make_vec_env(env_id, n_envs=zoo["n_envs"], seed=seed)
    if zoo["normalize"]:
        env = VecNormalize(env, gamma=zoo["kwargs"]["gamma"])
    kwargs = dict(zoo["kwargs"])
    if "linear" in zoo:
        lr, clip = zoo["linear"]
        kwargs.update(learning_rate=lambda f: f * lr, clip_range=lambda f: f * clip)
    policy_kwargs = dict(zoo.get("policy", {}))
    if "net_arch" in policy_kwargs:
        import torch
        policy_kwargs["activation_fn"] = torch.nn.ReLU
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, policy_kwargs=policy_kwargs or None, **kwargs)
    model.set_logger(Logger(folder=None, output_formats=[]))

    class Watch(BaseCallback):
        def __init__(self):
            super().__init__()
            self.returns: list = []
            self.hit: dict = {}

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    self.returns.append(info["episode"]["r"])
                    if not self.hit and len(self.returns) >= 20 and np.mean(self.returns[-20:]) >= target:
                        self.hit = {"seconds": time.time() - t0, "env_steps": int(self.num_timesteps)}
            return not self.hit

    watch = Watch()
    model.learn(total_timesteps=BUDGET, callback=watch)
    out = dict(watch.hit or {"seconds": None, "env_steps": None})
    if math.isnan(target):
        out["seconds"] = time.time() - t0
        if zoo["normalize"]:
            env.training, env.norm_reward = False, False
        mean, _ = evaluate_policy(model, env, n_eval_episodes=10, deterministic=True)
        out["return"] = float(mean)
    print(json.dumps(out))


# --------------------------------------------------------------------------- rows


def _crossing_rows(task: str, target: float, results: dict[str, list[dict]], ref: str) -> list[Row]:
    rows = []
    for ours_name in [k for k in results if k != ref]:
        for key, unit in (("seconds", "s"), ("env_steps", "env steps")):
            r = Row(f"{task} to {target:g} vs SB3 PPO zoo, {ours_name} ({'from launch' if key == 'seconds' else key})",
                    unit, ours_name, ref, higher_is_better=False, target=1.0 if key == "seconds" else None)
            missed = []
            for impl in (ours_name, ref):
                r.values[impl] = [math.inf if res[key] is None else float(res[key]) for res in results[impl]]
                missed += [f"{impl} seed {s}" for s, v in enumerate(r.values[impl], start=1) if v == math.inf]
            r.note = f"budget {BUDGET:,} env steps" + (f"; not reached: {', '.join(missed)}" if missed else "")
            rows.append(r)
    return rows


def _seeds(reps: int, runs: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {name: [] for name in runs}
    for seed in range(1, reps + 1):
        for name, run in runs.items():
            out[name].append(run(seed))
    return out


def run(reps: int = MIN_REPS, tasks: tuple[str, ...] = TASKS) -> list[Row]:
    if set(tasks) - {"novelocity"}:
        try:
            import stable_baselines3  # noqa: F401
        except ImportError:
            raise RuntimeError("the continuous benchmark needs Stable-Baselines3: pip install 'mpirl[bench]'") from None
    ref = "SB3 PPO (zoo)"
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        if "novelocity" in tasks:
            runs = {name: (lambda s, j=job, n=n, sets=sets, i=i, b=novelocity_budget(name):
                           ours_novelocity(j, n, sets, s, out, f"nv{i}", b))
                    for i, (name, (job, n, sets)) in enumerate(NOVELOCITY_JOBS.items())}
            rows += _novelocity_rows(_seeds(reps, runs))
        if "pendulum" in tasks:
            res = _seeds(reps, {"mpirl allreduce PPO": lambda s: ours_crossing("pendulum_ppo.toml", 2, [],
                                                                               PENDULUM_TARGET, s, out, "pendulum"),
                                ref: lambda s: sb3_run("Pendulum-v1", s, PENDULUM_TARGET)})
            rows += _crossing_rows("Pendulum-v1", PENDULUM_TARGET, res, ref)
        if "cartpole" in tasks:
            runs = {name: (lambda s, j=job, n=n, sets=sets, name=name:
                           ours_crossing(j, n, sets, CARTPOLE_TARGET, s, out, name.split()[1].lower()))
                    for name, (job, n, sets) in CARTPOLE_JOBS.items()}
            runs[ref] = lambda s: sb3_run("CartPole-v1", s, CARTPOLE_TARGET)
            rows += _crossing_rows("CartPole-v1", CARTPOLE_TARGET, _seeds(reps, runs), ref)
        for task, env_id, job in (("hopper", "Hopper-v5", "ppo_hopper.toml"),
                                  ("halfcheetah", "HalfCheetah-v5", "ppo_halfcheetah.toml")):
            if task not in tasks:
                continue
            res = _seeds(reps, {"mpirl allreduce PPO": lambda s, j=job: ours_final(j, s, out),
                                ref: lambda s, e=env_id: sb3_run(e, s, math.nan)})
            name = f"{env_id} at {BUDGET:,} env steps"
            ret = Row(f"{name}: deterministic return (10 episodes)", "return", "mpirl allreduce PPO", ref,
                      higher_is_better=True, target=1.0)
            sec = Row(f"{name}: seconds from launch", "s", "mpirl allreduce PPO", ref, higher_is_better=False,
                      target=2.0)
            for impl in res:
                ret.values[impl] = [r["return"] for r in res[impl]]
                sec.values[impl] = [r["seconds"] for r in res[impl]]
            rows += [ret, sec]
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sb3"]:
        sb3_main(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
