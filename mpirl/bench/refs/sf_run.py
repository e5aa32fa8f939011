"""One Sample Factory APPO run on CartPole-v1, a MinAtar game or an Atari game, to a mean return of TARGET over the
last 20 episodes (``inf``: none, the run takes its budget or its wall):

    python sf_run.py SEED BUDGET WALL TARGET [ENV]     (ENV: CartPole-v1 (default), MinAtar/Breakout-v1,
                                                        ALE/Pong-v5 or ALE/Breakout-v5)

Runs in the Sample Factory reference venv (:mod:`mpirl.bench.reference_venv`; it imports nothing of mpirl) and
prints one JSON line (below). On this machine's 2 cores every run has 2 rollout workers of 8 games, one policy
worker, device cpu and asynchronous sampling. Settings:

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
  heads (:func:`minatar_encoder`);
* an Atari game (``ALE/Pong-v5``, ``ALE/Breakout-v5``; :func:`atari_env`): Sample Factory's Atari example whole:
  ``atari_params.py``'s defaults, set by its own ``atari_override_defaults`` (the MinAtar list above plus frame
  skip 4, 4 frames stacked, observations scaled by 1/255, its ``convnet_atari`` encoder (Nature's: 32x8x8/4,
  64x4x4/2, 64x3x3/1, a 512-wide layer) and one split of the envs per worker), and the game made by its own
  ``make_atari_env`` (the game's ``NoFrameskip-v4`` id, which ale-py 0.12 makes as ``-v5`` with one frame a step
  and no sticky actions; 30 no-op starts, max over the last 2 of 4 frames, a lost life ends the episode it trains
  on, FIRE at reset where the game has it, rewards clipped to their sign for training, 84x84 grayscale, uint8
  frames), except: asynchronous sampling, 2 workers of 8 games instead of 8 of 1, no start-up decorrelation (as
  for MinAtar), and ``train_for_env_steps`` set to the budget in frames (agent steps x 4, as Sample Factory counts
  them) instead of the preset's 10M frames, which the linear learning-rate decay is spread over.

Every run sets ``experiment_summaries_interval`` to 100,000 s (no TensorBoard summaries written on the way), and
checkpoints (every 100,000 s) only at the end.

Sample Factory runs in a child process (its own process group) while this one reads the episodes and the step
counts :mod:`episode_file` records in every rollout worker. **The run's clock starts at the first env step any
worker took** (its ``seconds``, its ``wall`` and its crossing's seconds run from there, as RLlib's runs start at
their first env step and mpirl's on its job clock), so Sample Factory's start-up is left out of every run, to a
target or not. Once the target is reached, or at the budget or the wall, this process asks Sample Factory to stop
(a file the child watches every 0.2 s from Sample Factory's own event loop, which then stops training as at the
end of its budget, so its components log their timers; ``train_for_seconds`` is of no use: Sample Factory 2.1.1
never advances the seconds it compares with it); a child not gone ``STOP_GRACE`` seconds later has its process
group stopped.

The JSON line: the crossing (seconds since the first env step, env steps of the episodes finished by then,
episodes; null if not reached); ``env_steps_sampled``, every agent step all workers took up to the stop (the step
counts, not the steps of the finished episodes alone: an Atari game lasts minutes); ``frameskip`` (4 for Atari,
else 1: frames = agent steps x frameskip); ``env_steps_trained``, every sample of every epoch Sample Factory's
learner trained on, each pass counted (its learner's own count of the samples it consumed, as it stood when the
stop was asked, divided by the frame skip that Sample Factory multiplies it by (``summaries_use_frameskip``),
times ``num_epochs``: :func:`trained`), how it was counted in ``env_steps_trained_counted``; ``seconds``;
``episodes`` and ``last20``; ``learner_env_steps`` and ``learner_seconds`` (the learner's count, each sample once,
in agent steps, at its last periodic report, every 5 s, and that report's seconds on the run's clock; null before
the first report); ``learner_busy``, the share of the seconds from the first env step to the learner's stop that
the learner spent in its update step (its timer ``train``: every epoch's minibatch passes, without preparing the
batch), from the learner's timers Sample Factory logs as it stops (null, with the reason in
``learner_busy_note``, where the child had to be stopped before it logged them); ``first_step_at``, the seconds
from the child's start to the first env step; ``start_seconds``, from the child's start to Sample Factory's
signal to its rollout workers to start.

With ``MPIRL_SF_EPISODES`` set to a file name, the run's episodes are kept there as text (:func:`keep_episodes`: a
learning curve, ``analysis/atari_learning.py``); ``MPIRL_SF_LOG``, Sample Factory's log.
"""

from __future__ import annotations

import datetime as dt
import json
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

from ale_env import FRAMESKIP, is_ale  # noqa: E402
from episode_file import crossing, episodes, steps_taken  # noqa: E402


CARTPOLE = "CartPole-v1"
# Sample Factory's Atari settings (sf_examples/atari/atari_params.py) that apply to a MinAtar game, set as parser
# defaults as that example does (its "linear_decay" is no command-line choice); the departures are above.
ATARI = dict(with_vtrace=False, batch_size=256, rollout=128, num_epochs=4, num_batches_per_epoch=4, ppo_clip_ratio=0.1,
             value_loss_coeff=0.5, exploration_loss="entropy", exploration_loss_coeff=0.01, learning_rate=0.00025,
             lr_schedule="linear_decay", max_grad_norm=0.5, gamma=0.99, gae_lambda=0.95, adam_eps=1e-5,
             nonlinearity="relu", kl_loss_coeff=0.0, adaptive_stddev=False, shuffle_minibatches=False,
             normalize_input=True, normalize_returns=True, reward_scale=1.0,
             obs_scale=1.0, decorrelate_envs_on_one_worker=False)
# An Atari game: Sample Factory's own atari_override_defaults, then these departures (listed above).
ATARI_DEPARTURES = dict(async_rl=True, num_workers=2, num_envs_per_worker=8, decorrelate_envs_on_one_worker=False)
STOP_FILE = "stop"  # made in the run's folder when the run is to stop
STOPPED = "mpirl: stop asked"  # the child's log line when it saw the file
SETTINGS = "mpirl: counts"  # the child's log line of the settings its counts depend on
STOP_GRACE = 90.0  # seconds the child has to stop by itself once asked (its learner ends its batch first)


def make_env(full_env_name, cfg=None, env_config=None, render_mode=None):
    import episode_file
    if is_ale(full_env_name):
        return episode_file.EpisodeFile(atari_env(full_env_name, cfg), games=True)
    return episode_file.make(full_env_name)


def atari_env(env_id: str, cfg):
    """An ALE game made by Sample Factory's own ``make_atari_env`` (``sf_examples/atari/atari_utils.py``), which
    knows the games by its own names (``atari_pong``) and makes their ``NoFrameskip-v4`` ids (:func:`ale_env.legacy_id`:
    ale-py 0.12 makes them as ``-v5`` with one frame a step and no sticky actions) wrapped: Gymnasium's
    ``RecordEpisodeStatistics`` (the whole game's unclipped return in ``info``, which :mod:`episode_file` records),
    30 no-op starts, the max of the last two of ``env_frameskip`` frames, a life's loss ends an episode (not the
    game), FIRE at reset where the game has it, rewards clipped to their sign, 84x84, grayscale,
    ``env_framestack`` frames stacked: uint8 ``(4, 84, 84)``."""
    import ale_env
    from sf_examples.atari.atari_utils import ATARI_ENVS, make_atari_env
    ale_env.register()  # the NoFrameskip-v4 ids, which ale-py cannot register by itself under Gymnasium 0.29
    legacy = ale_env.legacy_id(env_id)
    names = [spec.name for spec in ATARI_ENVS if spec.env_id == legacy]
    if not names:
        raise SystemExit(f"Sample Factory's Atari example has no {legacy} ({env_id})")
    return make_atari_env(names[0], cfg, None)


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


def watch_stop_file(runner, path: str) -> None:
    """Stop ``runner`` (Sample Factory's, in this child) as at the end of its budget once ``path`` exists: a timer
    of its own event loop looks every 0.2 s, logs the time and its learner's count (``STOPPED``), and calls the
    runner's stop, which stops every component, each logging its timers."""
    from sample_factory.utils.utils import log
    from signal_slot.signal_slot import EventLoopObject, Timer

    class StopWatch(EventLoopObject):
        def check(self):
            if not runner.stopped and os.path.exists(path):
                log.info(f"{STOPPED} at {time.time():.6f}; learner env steps {sum(runner.env_steps.values())}")
                runner._stop_training()  # what Sample Factory calls itself at the end of its budget

    watch = StopWatch(runner.event_loop, "mpirl_stop_watch")
    timer = Timer(runner.event_loop, 0.2)
    timer.timeout.connect(watch.check)
    runner.timers.append(timer)  # stopped with the runner's own
    runner.mpirl_stop_watch = watch  # kept alive beside the runner


def train(seed: int, budget: int, wall: float, folder: str, env_id: str = CARTPOLE) -> int:
    """Sample Factory's APPO (this process is the child), its train dir under ``folder``."""
    from sample_factory.algo.utils.misc import ExperimentStatus
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner
    from sample_factory.utils.utils import log
    cartpole, ale = env_id == CARTPOLE, is_ale(env_id)
    if not (cartpole or ale or env_id.startswith("MinAtar/")):
        raise SystemExit(f"no settings for {env_id!r}: {CARTPOLE}, a MinAtar game or an ALE/ game")
    register_env(env_id, make_env)
    frames = budget * (FRAMESKIP if ale else 1)  # Sample Factory counts frames where the frame skip is its own
    settings = ["--with_vtrace=False", "--batch_size=512", "--reward_scale=0.1"] if cartpole else []
    argv = [f"--env={env_id}", "--algo=APPO", "--use_rnn=False", "--recurrence=1", *settings, "--num_workers=2",
            "--num_envs_per_worker=8", "--policy_workers_per_policy=1", "--device=cpu", f"--seed={seed}",
            f"--train_for_env_steps={frames}", f"--train_dir={os.path.join(folder, 'sf')}",
            "--experiment=cartpole" if cartpole else "--experiment=run", "--save_every_sec=100000",
            "--save_best_every_sec=100000", "--experiment_summaries_interval=100000", "--with_wandb=False"]
    parser, partial = parse_sf_args(argv=argv)
    if ale:
        from sf_examples.atari.atari_params import atari_override_defaults
        atari_override_defaults(partial.env, parser)
        parser.set_defaults(**ATARI_DEPARTURES)
    elif not cartpole:
        from sample_factory.algo.utils.context import global_model_factory
        global_model_factory().register_encoder_factory(minatar_encoder)
        parser.set_defaults(**ATARI)
    cfg = parse_full_cfg(parser, argv)
    log.info(f"{SETTINGS}: num_epochs={cfg.num_epochs} env_frameskip={cfg.env_frameskip} "
             f"summaries_use_frameskip={cfg.summaries_use_frameskip}")
    cfg, runner = make_runner(cfg)
    watch_stop_file(runner, os.path.join(folder, STOP_FILE))
    status = runner.init()
    if status == ExperimentStatus.SUCCESS:
        status = runner.run()
    return status


STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]\[ *\d+\] "  # its log lines' local time
REPORT = re.compile(STAMP + r"Fps is .*?Total num frames: (\d+)\.")
START = re.compile(STAMP + r"All inference workers are ready! Signal rollout workers to start!")
STOP_LINE = re.compile(re.escape(STOPPED) + r" at ([\d.]+); learner env steps (\d+)")
SETTINGS_LINE = re.compile(re.escape(SETTINGS) + r": num_epochs=(\d+) env_frameskip=(\d+) "
                                                 r"summaries_use_frameskip=(True|False)")
COLLECTED = re.compile(r"Collected \{0: (\d+)\}, FPS")
LEARNER_STOPPED = re.compile(STAMP + r"Component LearnerWorker_p0 stopped!")
LEARNER_TRAIN = re.compile(r"Learner 0 profile tree view:\n(?:.*\n)*?train: ([\d.]+)")  # its top-level timer
START_ALLOWANCE = 150.0  # seconds a run waits for Sample Factory's first env step


def when(stamp: str) -> float:
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def started_at(log: str) -> float | None:
    """The time (``time.time()``) Sample Factory's ``log`` says it set its rollout workers going; None if not."""
    found = START.search(log)
    return when(found.group(1)) if found else None


def per_agent_step(log: str) -> tuple[int, int]:
    """(num_epochs, the factor Sample Factory's learner counts each sample by): the frame skip where
    ``summaries_use_frameskip`` is on, as it is by default, else 1; from the child's settings line."""
    found = SETTINGS_LINE.search(log)
    if not found:
        return 1, 1
    epochs, frameskip, scaled = found.groups()
    return int(epochs), int(frameskip) if scaled == "True" else 1


def learner_count(log: str, origin: float) -> tuple[int | None, float | None]:
    """The agent steps Sample Factory's learner had consumed at its last periodic report in ``log`` (each sample
    once), and that report's seconds since ``origin`` (a ``time.time()``; None, None before any report)."""
    reports = REPORT.findall(log)
    if not reports:
        return None, None
    stamp, frames = reports[-1]
    return int(frames) // per_agent_step(log)[1], when(stamp) - origin


def trained(log: str) -> tuple[int | None, str]:
    """Every sample of every epoch the learner trained on, in agent steps, and how that was counted: the learner's
    count of the samples it consumed when the stop was asked (``STOPPED``), or at its end (``Collected``) if it
    ended by itself, or at its last report; divided by its frame factor, times ``num_epochs``."""
    epochs, factor = per_agent_step(log)
    how = (f"Sample Factory's learner's consumed samples (its env_steps / {factor}, the frame skip it multiplies "
           f"them by) x num_epochs {epochs}")
    stop, end, reports = STOP_LINE.search(log), COLLECTED.search(log), REPORT.findall(log)
    if stop:
        consumed, how = int(stop.group(2)), how + ", when the stop was asked"
    elif end:
        consumed, how = int(end.group(1)), how + ", at its end"
    elif reports:
        consumed, how = int(reports[-1][1]), how + ", at its last periodic report"
    else:
        return None, "no count of the learner's in the log"
    return consumed // factor * epochs, how


def learner_busy(log: str, origin: float) -> tuple[float | None, str]:
    """The share of the seconds from ``origin`` (the first env step) to the learner's stop that the learner spent
    in its update step (its timer ``train``), from the timers Sample Factory logs as its learner stops; None and
    why where they are not in ``log``."""
    busy, stopped = LEARNER_TRAIN.search(log), LEARNER_STOPPED.search(log)
    if not (busy and stopped):
        return None, "Sample Factory logged no learner timers (it was stopped before it logged them)"
    seconds = when(stopped.group(1)) - origin
    return (float(busy.group(1)) / seconds if seconds > 0 else None,
            "Sample Factory's learner timer 'train' (its minibatch passes of every epoch) over the seconds from "
            "the first env step to the learner's stop")


def stop(child: subprocess.Popen, folder: str, ask: bool = True) -> None:
    """Ask Sample Factory to stop (``STOP_FILE``) and wait ``STOP_GRACE`` s for it (unless not ``ask``: it never
    started), then stop its process group."""
    if ask:
        open(os.path.join(folder, STOP_FILE), "w").close()
        try:
            child.wait(timeout=STOP_GRACE)
            return
        except subprocess.TimeoutExpired:
            pass
    os.killpg(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def keep_episodes(rows, origin: float, path: str) -> None:
    """The run's episodes as text, one a line: seconds since the first env step, length (agent steps), return."""
    with open(path, "w") as f:
        for t, length, ret in rows:
            f.write(f"{t - origin:.3f} {length} {ret:g}\n")


def main(seed: int, budget: int, wall: float, target: float, env_id: str = CARTPOLE) -> None:
    """Every time here runs from Sample Factory's first env step in any worker (``first_step_at`` after the child's
    start)."""
    folder = tempfile.mkdtemp(prefix="mpirl-sf-")
    env = {**os.environ, "MPIRL_EPISODES": folder, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    t0_wall = time.time()  # the script's clock: the child's start
    log_path = os.path.join(folder, "sf.log")
    log = open(log_path, "w+")  # Sample Factory logs plenty: a file, never a pipe to fill
    child = subprocess.Popen([sys.executable, __file__, "--train", str(seed), str(budget), str(wall), folder, env_id],
                             env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    hit, origin, steps, rows, end = None, None, 0, [], None
    try:
        while child.poll() is None:
            time.sleep(0.25)
            first, steps = steps_taken(folder)
            now = time.time()
            origin = first
            if origin is None:
                if now - t0_wall >= START_ALLOWANCE:
                    break  # never started: reported below as no env step taken
                continue
            rows = episodes(folder)
            hit = crossing(rows, target, origin)
            if hit or steps >= budget or now - origin >= wall:
                end = now
                break
    finally:
        if child.poll() is None:
            stop(child, folder, ask=origin is not None)
        else:  # Sample Factory stopped by itself: its steps and episodes up to the end count
            end = time.time()
            (origin, steps), rows = steps_taken(folder), episodes(folder)
            hit = crossing(rows, target, origin) if origin is not None else None
        log.seek(0)
        err = log.read()
        log.close()
        if os.environ.get("MPIRL_SF_LOG"):  # where to keep Sample Factory's log, to look at
            shutil.copy(log_path, os.environ["MPIRL_SF_LOG"])
        if os.environ.get("MPIRL_SF_EPISODES") and origin is not None:  # where to keep the episodes (a curve)
            keep_episodes(rows, origin, os.environ["MPIRL_SF_EPISODES"])
        shutil.rmtree(folder, ignore_errors=True)
    if not steps or origin is None:
        raise SystemExit(f"Sample Factory took no env step (exit {child.returncode}): {err[-3000:]}")
    none = {"seconds": None, "env_steps": None, "episodes": None}
    learned, learned_at = learner_count(err, origin)
    trained_steps, counted = trained(err)
    busy, busy_note = learner_busy(err, origin)
    start = started_at(err)
    print(json.dumps({str(target): hit or none, "env_steps_sampled": steps, "env_steps_trained": trained_steps,
                      "env_steps_trained_counted": counted, "seconds": end - origin, "episodes": len(rows),
                      "last20": sum(r for _, _, r in rows[-20:]) / max(len(rows[-20:]), 1),
                      "frameskip": FRAMESKIP if is_ale(env_id) else 1, "learner_env_steps": learned,
                      "learner_seconds": learned_at, "learner_busy": busy, "learner_busy_note": busy_note,
                      "first_step_at": origin - t0_wall,
                      "start_seconds": start - t0_wall if start is not None else None}))


if __name__ == "__main__":
    if sys.argv[1] == "--train":
        sys.exit(train(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], *sys.argv[6:7]))
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), *sys.argv[5:6])
