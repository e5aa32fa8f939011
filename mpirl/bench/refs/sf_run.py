"""One Sample Factory APPO run on CartPole-v1 or a MinAtar game, to a mean return of TARGET over the last 20
episodes (``inf``: none, the run takes its budget or its wall):

    python sf_run.py SEED BUDGET WALL TARGET [ENV]     (ENV: CartPole-v1 (default) or MinAtar/Breakout-v1)

Runs in the Sample Factory reference venv (:mod:`mpirl.bench.reference_venv`; it imports nothing of mpirl) and
prints one JSON line as ``rllib_run.py`` does, plus Sample Factory's own count of the env steps its learner
consumed (each sample once, however many epochs train on it), ``learner_env_steps``, as of its last periodic
report (every 5 s) and that report's ``learner_seconds`` on the run's clock (below; null before the first
report); read from its log. On this machine's 2 cores every run has 2 rollout workers of 8 games, one policy worker and
asynchronous sampling. Settings:

* CartPole-v1: Sample Factory's own CartPole example (``sf_examples/train_gym_env.py``'s command line: APPO
  without an RNN, batch 512, reward scale 0.1);
* a MinAtar game (:mod:`minatar_env`): Sample Factory's Atari settings (``sf_examples/atari/atari_params.py``:
  rollout 128, batch 256, 4 epochs of 4 batches, clip 0.1, lr 2.5e-4 decaying linearly over the budget, Adam eps
  1e-5, entropy 0.01, value loss 0.5, max grad norm 0.5, GAE lambda 0.95, input and return normalisation, no
  V-trace, no RNN) except: asynchronous sampling (Sample Factory's default, and APPO's; the Atari preset trains
  synchronously to match CleanRL's results), observations as they are (0/1 planes: no 1/255 scale, no frame skip
  or stack), 2 workers of 8 games instead of 8 of 1, and no start-up decorrelation (with 8 games a worker
  otherwise plays rollout x game index random steps at start, 7,168 in all, that are never trained on; the Atari
  preset's one game per worker plays none), and MinAtar's network instead of the Atari convolutions (which need
  36x36 frames or more): one 16x3x3 convolution, a 128-wide layer, then Sample Factory's linear policy and value
  heads (:func:`minatar_encoder`).

Sample Factory runs in a child process (its own process group) while this one reads the episodes
:mod:`episode_file` records in every rollout worker; once the target is reached, or at the budget or the wall
time, the child's group is stopped. Times of a run to a target run from the child's start (Sample Factory builds its
workers and model inside it); those of a run with no target (``inf``: a throughput run, the wall its only stop) from
Sample Factory's signal to its rollout workers to start, so its start-up (15-30 s on this busy 2-core machine) is
left out as RLlib's build and mpirl's MPI start-up are (:func:`main`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from episode_file import crossing, episodes  # noqa: E402


CARTPOLE = "CartPole-v1"
# Sample Factory's Atari settings (sf_examples/atari/atari_params.py) that apply to a MinAtar game, set as parser
# defaults as that example does (its "linear_decay" is no command-line choice); the departures are above.
ATARI = dict(with_vtrace=False, batch_size=256, rollout=128, num_epochs=4, num_batches_per_epoch=4, ppo_clip_ratio=0.1,
             value_loss_coeff=0.5, exploration_loss="entropy", exploration_loss_coeff=0.01, learning_rate=0.00025,
             lr_schedule="linear_decay", max_grad_norm=0.5, gamma=0.99, gae_lambda=0.95, adam_eps=1e-5,
             nonlinearity="relu", kl_loss_coeff=0.0, adaptive_stddev=False, shuffle_minibatches=False,
             normalize_input=True, normalize_returns=True, reward_scale=1.0,
             obs_scale=1.0, decorrelate_envs_on_one_worker=False)


def make_env(full_env_name, cfg=None, env_config=None, render_mode=None):
    import episode_file
    return episode_file.make(full_env_name)


def minatar_encoder(cfg, obs_space):
    """MinAtar's network as Sample Factory's encoder: (B, 10, 10, C) planes -> Conv 16x3x3/1 -> ReLU -> 128 -> ReLU
    (Sample Factory adds the linear policy and value heads)."""
    import torch
    from sample_factory.model.encoder import Encoder

    class MinAtarEncoder(Encoder):
        def __init__(self):
            super().__init__(cfg)
            height, width, channels = obs_space["obs"].shape  # channels last, as the game gives them
            self.net = torch.nn.Sequential(torch.nn.Conv2d(channels, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                           torch.nn.Linear(16 * (height - 2) * (width - 2), 128), torch.nn.ReLU())

        def forward(self, obs_dict):
            return self.net(obs_dict["obs"].permute(0, 3, 1, 2))

        def get_out_size(self) -> int:
            return 128

    return MinAtarEncoder()


def train(seed: int, budget: int, wall: float, train_dir: str, env_id: str = CARTPOLE) -> int:
    """Sample Factory's APPO (this process is the child)."""
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import run_rl
    cartpole = env_id == CARTPOLE
    if not (cartpole or env_id.startswith("MinAtar/")):
        raise SystemExit(f"no settings for {env_id!r}: {CARTPOLE} or a MinAtar game")
    register_env(env_id, make_env)
    settings = ["--with_vtrace=False", "--batch_size=512", "--reward_scale=0.1"] if cartpole else []
    argv = [f"--env={env_id}", "--algo=APPO", "--use_rnn=False", "--recurrence=1", *settings, "--num_workers=2",
            "--num_envs_per_worker=8", "--policy_workers_per_policy=1", "--device=cpu", f"--seed={seed}",
            f"--train_for_env_steps={budget}", f"--train_for_seconds={int(wall) + 1}", f"--train_dir={train_dir}",
            "--experiment=cartpole" if cartpole else "--experiment=run", "--save_every_sec=100000",
            "--save_best_every_sec=100000", "--experiment_summaries_interval=100000", "--with_wandb=False"]
    parser, _ = parse_sf_args(argv=argv)
    if not cartpole:
        from sample_factory.algo.utils.context import global_model_factory
        global_model_factory().register_encoder_factory(minatar_encoder)
        parser.set_defaults(**ATARI)
    return run_rl(parse_full_cfg(parser, argv))


STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]\[ *\d+\] "  # its log lines' local time
REPORT = re.compile(STAMP + r"Fps is .*?Total num frames: (\d+)\.")
START = re.compile(STAMP + r"All inference workers are ready! Signal rollout workers to start!")
START_ALLOWANCE = 180.0  # seconds a throughput run waits for Sample Factory to start its rollout workers


def when(stamp: str) -> float:
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def started_at(path: str) -> float | None:
    """The time (``time.time()``) Sample Factory's log at ``path`` says it set its rollout workers going; None if
    not yet."""
    with open(path) as f:
        found = START.search(f.read())
    return when(found.group(1)) if found else None


def learner_count(log: str, origin: float) -> tuple[int | None, float | None]:
    """The env steps Sample Factory's learner had consumed at its last report in ``log``, and that report's
    seconds since ``origin`` (a ``time.time()``; None, None before any report)."""
    reports = REPORT.findall(log)
    if not reports:
        return None, None
    stamp, frames = reports[-1]
    return int(frames), when(stamp) - origin


def main(seed: int, budget: int, wall: float, target: float, env_id: str = CARTPOLE) -> None:
    """A run to ``target`` is timed from the child's start, as the CartPole rows always were; a run with no target
    (``inf``: a throughput run) from Sample Factory's signal to its rollout workers, as RLlib's runs start after
    their build and mpirl's on its job clock: its ``wall`` and its seconds leave Sample Factory's start-up out
    (``start_seconds``: the child's start to that signal, in the JSON line of every run)."""
    folder = tempfile.mkdtemp(prefix="mpirl-sf-")
    env = {**os.environ, "MPIRL_EPISODES": folder, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    throughput = math.isinf(target)
    t0_wall, t0 = time.time(), time.perf_counter()
    log_path = os.path.join(folder, "sf.log")
    log = open(log_path, "w+")  # Sample Factory logs plenty: a file, never a pipe to fill
    child = subprocess.Popen([sys.executable, __file__, "--train", str(seed), str(budget), str(wall), folder, env_id],
                             env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    hit, steps, rows = None, 0, []
    origin = None if throughput else t0_wall  # the time.time() the run's clock starts at
    try:
        while child.poll() is None:
            time.sleep(0.5)
            if origin is None:
                origin = started_at(log_path)
            rows = episodes(folder)
            steps = sum(length for _, length, _ in rows)
            hit = crossing(rows, target, t0_wall)
            timed = None if origin is None else time.perf_counter() - t0 - (origin - t0_wall)
            if hit or steps >= budget or (timed is not None and timed >= wall):
                break
            if origin is None and time.perf_counter() - t0 >= START_ALLOWANCE:
                break  # never started: reported below as no episode played
    finally:
        seconds = time.perf_counter() - t0 - ((origin or t0_wall) - t0_wall)
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
    learned, learned_at = learner_count(err, origin or t0_wall)
    start = START.search(err)
    print(json.dumps({str(target): hit or none, "env_steps_sampled": steps, "env_steps_trained": None,
                      "seconds": seconds, "episodes": len(rows),
                      "last20": sum(r for _, _, r in rows[-20:]) / max(len(rows[-20:]), 1),
                      "learner_env_steps": learned, "learner_seconds": learned_at,
                      "start_seconds": when(start.group(1)) - t0_wall if start else None}))


if __name__ == "__main__":
    if sys.argv[1] == "--train":
        os.makedirs(sys.argv[5], exist_ok=True)
        sys.exit(train(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), os.path.join(sys.argv[5], "sf"),
                       *sys.argv[6:7]))
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), *sys.argv[5:6])
