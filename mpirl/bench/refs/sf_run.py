"""One Sample Factory APPO run on CartPole-v1, to a mean return of TARGET over the last 20 episodes:

    python sf_cartpole.py SEED BUDGET WALL TARGET

Runs in the Sample Factory reference venv (:mod:`mpirl.bench.reference_venv`; it imports nothing of mpirl) and
prints one JSON line as ``rllib_cartpole.py`` does. The settings are Sample Factory's own CartPole example
(``sf_examples/train_gym_env.py``'s command line: APPO without an RNN, batch 512, reward scale 0.1) on this
machine's 2 cores: 2 rollout workers of 8 games, one policy worker, asynchronous sampling. Sample Factory runs
in a child process (its own process group) while this one reads the episodes :mod:`episode_file` records in every
rollout worker; once the target is reached, or at the budget or the wall time, the child's group is stopped.
Times run from the child's start (Sample Factory builds its workers and model inside it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from episode_file import crossing, episodes  # noqa: E402


def make_env(full_env_name, cfg=None, env_config=None, render_mode=None):
    import episode_file
    return episode_file.make(full_env_name)


def train(seed: int, budget: int, wall: float, train_dir: str) -> int:
    """Sample Factory's APPO (this process is the child)."""
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import run_rl
    register_env("CartPole-v1", make_env)
    argv = ["--env=CartPole-v1", "--algo=APPO", "--use_rnn=False", "--recurrence=1", "--with_vtrace=False",
            "--batch_size=512", "--reward_scale=0.1", "--num_workers=2", "--num_envs_per_worker=8",
            "--policy_workers_per_policy=1", "--device=cpu", f"--seed={seed}", f"--train_for_env_steps={budget}",
            f"--train_for_seconds={int(wall) + 1}", f"--train_dir={train_dir}", "--experiment=cartpole",
            "--save_every_sec=100000", "--save_best_every_sec=100000", "--experiment_summaries_interval=100000",
            "--with_wandb=False"]
    parser, _ = parse_sf_args(argv=argv)
    return run_rl(parse_full_cfg(parser, argv))


def main(seed: int, budget: int, wall: float, target: float) -> None:
    folder = tempfile.mkdtemp(prefix="mpirl-sf-")
    env = {**os.environ, "MPIRL_EPISODES": folder, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    t0_wall, t0 = time.time(), time.perf_counter()
    log = open(os.path.join(folder, "sf.log"), "w+")  # Sample Factory logs plenty: a file, never a pipe to fill
    child = subprocess.Popen([sys.executable, __file__, "--train", str(seed), str(budget), str(wall), folder],
                             env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    hit, steps, rows = None, 0, []
    try:
        while child.poll() is None:
            time.sleep(0.5)
            rows = episodes(folder)
            steps = sum(length for _, length, _ in rows)
            hit = crossing(rows, target, t0_wall)
            if hit or steps >= budget or time.perf_counter() - t0 >= wall:
                break
    finally:
        seconds = time.perf_counter() - t0
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        else:  # Sample Factory stopped by itself: its episodes up to the end count
            rows = episodes(folder)
            steps, hit = sum(length for _, length, _ in rows), crossing(rows, target, t0_wall)
        log.seek(0)
        err = log.read()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)
    if not steps:
        raise SystemExit(f"Sample Factory played no episode (exit {child.returncode}): {err[-3000:]}")
    none = {"seconds": None, "env_steps": None, "episodes": None}
    print(json.dumps({str(target): hit or none, "env_steps_sampled": steps, "env_steps_trained": None,
                      "seconds": seconds, "episodes": len(rows),
                      "last20": sum(r for _, _, r in rows[-20:]) / max(len(rows[-20:]), 1)}))


if __name__ == "__main__":
    if sys.argv[1] == "--train":
        os.makedirs(sys.argv[5], exist_ok=True)
        sys.exit(train(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), os.path.join(sys.argv[5], "sf")))
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
