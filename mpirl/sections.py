"""The shared sections of a job file (``[run]``, ``[topology]``, ``[env]``, ``[agent]``, ``[replay]``,
``[comm]``, ``[log]``, ``[checkpoint]``): one dataclass each, every field with its default and its declared
domain (:func:`mpirl.domain.setting`). An algorithm's own sections live in its ``settings.py``; which keys of
these an algorithm reads, in its ``USES``. Loading and validation: :mod:`mpirl.config`. Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from mpirl.domain import ConfigError, Domain, setting


def _algorithm_names() -> tuple[str, ...]:
    """The folders of mpirl/algos/ that declare settings: adding an algorithm is adding a folder."""
    root = Path(__file__).resolve().parent / "algos"
    return tuple(sorted(p.name for p in root.iterdir() if (p / "settings.py").is_file()))


ALGORITHMS = _algorithm_names()


@dataclass
class RunConfig:
    name: str = setting("run", name=True)
    seed: int = setting(0, ge=0)
    out_dir: str = setting("runs", text=True)
    # Stop conditions: the job stops at the first one reached; 0 disables one.
    train_steps: int = setting(0, ge=0, why="0 disables it")
    env_steps: int = setting(0, ge=0, why="0 disables it")
    wall_seconds: float = setting(0.0, ge=0, why="0 disables it")
    # Stop once the mean return of the last `return_window` episodes reaches this (nan: never).
    target_return: float = setting(math.nan, nan=True, why="nan disables it")
    return_window: int = setting(20, ge=1, le=1_000_000)
    # Whose episodes that window (and the learner's return_mean20) holds: "all" actors', or
    # "least_exploring": only the last actor rank's (the smallest Ape-X epsilons; an evaluator's
    # view, since an actor playing 40 % random actions may never reach a high target).
    return_from: str = setting("all", choices=("all", "least_exploring"))


@dataclass
class TopologyConfig:
    # Learner ranks (Gorila's several learners, data-parallel; Ape-X): K >= 2 learners each draw their 1/K of
    # every batch from the shards, sum their gradients with an allreduce and step identical copies of the
    # network; the first learner publishes parameters and writes the shared metrics.
    learners: int = setting(1, ge=1, le=4096, why="the learner ranks; > 1: data-parallel learners (Ape-X)")
    # Buffer ranks; 0 (IMPALA only): the actors send straight to a queue on the learner's rank.
    buffers: int = setting(1, ge=0, le=4096, why="0: actors send to the learner itself (IMPALA)")
    # Actor ranks in all; 0: every rank after the learner and the buffers is an actor.
    # Actors are spread over the buffers as evenly as possible.
    actors: int = setting(0, ge=0, le=1_000_000, why="0: every remaining rank")
    # Put each buffer's actors on the buffer's own node where the allocation allows it.
    node_local: bool = setting(True)
    # Inference workers (DMCAF's actor-worker-learner): 0, actors run the policy themselves; K >= 1, ranks
    # after the buffers are K workers that run it for their actors in batched forward passes and send
    # the experience to the buffers; the actors only step their environments. "learner": the learner's
    # rank is the one worker and serves between its train steps (DMCAF's actor-worker, AW; one buffer).
    workers: int = setting(0, ge=0, le=1_000_000, also=("learner",),
                           why="0: actors run the policy themselves; 'learner': the learner serves them")
    # A worker answers the actors' requests that are in, up to this many in one forward pass ...
    worker_batch: int = setting(64, ge=1, le=1_000_000)
    # ... or once the oldest pending request has waited this long (microseconds), whichever comes first.
    worker_deadline_us: float = setting(200.0, ge=0, le=1e9)

    @property
    def on_learner(self) -> bool:
        """The learner's rank serves the actors (``workers = "learner"``)."""
        return self.workers == "learner"

    @property
    def worker_ranks(self) -> int:
        """Ranks that are nothing but inference workers (0 without workers, and with the worker on the learner)."""
        return 0 if self.on_learner else self.workers

    @property
    def served(self) -> bool:
        """Actors only step their games and a worker (a worker rank or the learner) runs the policy for them."""
        return self.on_learner or self.workers > 0


@dataclass
class PredatorPreyConfig:
    """The sources' stag-hunt predator-prey (``env.id = "predator_prey"``, mpirl/envs/predator_prey.py)."""
    grid: int = setting(10, ge=3, le=1000, why="the square grid's side")
    predators: int = setting(8, ge=2, le=10_000)
    # Prey on the grid; 0: as many as predators, as the sources do.
    prey: int = setting(0, ge=0, le=10_000, why="0: as many as predators")
    # Added to the team reward for each lone catch (a catch no second predator joined): 0 or -1.5 in the sources.
    punishment: float = setting(0.0, ge=-1000, le=0)
    capture_reward: float = setting(10.0, gt=0, le=1e6)

    def crowding(self) -> tuple[str, str] | None:
        """``(key, message)`` when the predators and prey do not fit on the grid, leading with the field to
        change: the count that differs from its default (the prey before the predators), else the grid."""
        g, n = self.grid, self.predators
        m = self.prey or n
        if n + m <= g * g:
            return None
        default = PredatorPreyConfig()
        side = math.isqrt(n + m - 1) + 1  # the smallest square that holds them
        most_predators = g * g // 2 if not self.prey else g * g - m
        if self.prey and self.prey != default.prey and g * g - n >= 1:
            key, fix = "prey", f"at most {g * g - n}"
        elif n != default.predators and most_predators >= 2:
            key, fix = "predators", f"at most {most_predators}" + (" (as many prey)" if not self.prey else "")
        else:
            key, fix = "grid", f"at least {side}"
        return (f"env.predator_prey.{key}", f"{n} predators and {m} prey need {n + m} cells and a {g}x{g} grid has "
                                            f"{g * g}; set env.predator_prey.{key} to {fix}")


@dataclass
class EnvConfig:
    id: str = setting("CartPole-v1", text=True)
    envs_per_actor: int = setting(1, ge=1, le=4096)
    # 0 keeps the environment's own time limit.
    max_episode_steps: int = setting(0, ge=0, why="0 keeps the environment's limit")
    # Which axis of a 3-D (image) observation holds the channels: "auto" reads (H, W, C) when the last
    # axis is no longer than the others (Gymnasium's layout; MinAtar's (10, 10, C)), else (C, H, W).
    channels: str = setting("auto", choices=("auto", "last", "first"))
    # Atari ("ALE/<Game>-v5" ids, ale-py's native vector env): DQN/Ape-X preprocessing.
    frameskip: int = setting(4, ge=1, le=100)
    frame_stack: int = setting(4, ge=1, le=64)
    noop_max: int = setting(30, ge=0, le=100_000)
    repeat_action_probability: float = setting(0.0, ge=0, le=1)
    env_threads: int = setting(1, ge=1, le=1024)
    # A lost life cuts the n-step bootstrap like a terminal (DQN/Ape-X practice); episodes go on.
    terminal_on_life_loss: bool = setting(True)
    # Press FIRE after a lost life, as the reset does (games that need it to go on, e.g. Breakout).
    fire_on_life_loss: bool = setting(True)
    predator_prey: PredatorPreyConfig = field(default_factory=PredatorPreyConfig)


@dataclass
class AgentConfig:
    # Which algorithm the job runs: a folder of mpirl/algos/ (its settings, roles and records).
    algorithm: str = setting("apex", choices=ALGORITHMS)
    gamma: float = setting(0.99, gt=0, le=1)
    lr: float = setting(1e-3, gt=0)
    adam_eps: float = setting(1e-8, gt=0)
    hidden: list = setting([128, 128], items=Domain(ge=1, le=1_000_000),
                           why="layer widths such as [128, 128]")
    # The Q-network's torso: "auto" takes the MLP for vectors, MinAtar's one-convolution network for
    # images smaller than 36x36, the Nature-DQN convolutions from 36x36 up (84x84 Atari stacks). For
    # images the dueling streams are hidden[-1] wide.
    network: str = setting("auto", choices=("auto", "mlp", "minatar", "nature"))
    # The actor-critics (IMPALA, a3c): the activation between an MLP's layers (convolutions keep ReLU) and whether
    # the value shares the policy's torso (false: a network of its own, the same widths, as SB3's and CleanRL's
    # PPO for MuJoCo).
    activation: str = setting("relu", choices=("relu", "tanh"))
    shared_torso: bool = setting(True)
    # A Gaussian policy's (Box actions) log standard deviation at the start, the same in every dimension; learned.
    log_std_init: float = setting(0.0, ge=-10, le=5)
    # "lstm": an LSTM core of hidden[-1] units after the shared layer (IMPALA and the gradient family): each game's
    # state carried across steps, zeroed where an episode starts, stored at each rollout's (trajectory's) start for
    # the loss to unroll from.
    recurrent: str = setting("none", choices=("none", "lstm"))
    # The actor-critics' (IMPALA, a3c) first weights: "torch", PyTorch's per-layer defaults; "orthogonal", the
    # actor-critic references' (OpenAI Baselines, CleanRL, SB3, Sample Factory): every hidden layer orthogonal with
    # gain sqrt(2), the policy head 0.01, the value head 1, an LSTM core 1, biases 0. On the Nature CNN PyTorch's
    # defaults leave the shared layer's activations about 30x smaller (rms 0.015 against 0.43 on Pong's stacks);
    # what either start does for learning on Pong within 2.5 M frames: docs/impala.md (no difference seen yet).
    weight_init: str = setting("torch", choices=("torch", "orthogonal"))
    # Running statistics of the job (mpirl.agents.running_stats), merged across its ranks: observations normalised
    # to zero mean and unit variance (vector observations; uint8 images pixel by pixel after the networks' 1/255,
    # Sample Factory's normalize_input on Atari, which clips at 5), rewards divided by the standard deviation of the
    # discounted return (gamma); each then clipped to +- its clip (SB3's VecNormalize, defaults alike).
    # normalize_reward is on by default for IMPALA and the gradient family (their settings' DEFAULTS).
    normalize_obs: bool = setting(False)
    normalize_reward: bool = setting(False)
    normalized_obs_clip: float = setting(10.0, gt=0, le=1e6)
    normalized_reward_clip: float = setting(10.0, gt=0, le=1e6)
    # Schedules (mpirl.agents.schedules): lr goes linearly to lr_final over the first schedule_steps of the run,
    # counted in schedule_unit (0: the run's own run.env_steps or run.train_steps), then stays; nan: constant. The
    # entropy coefficient and PPO's clip have their *_final in their algorithm's section.
    lr_final: float = setting(math.nan, ge=0, nan=True, why="nan: a constant learning rate")
    schedule_unit: str = setting("env_steps", choices=("env_steps", "train_steps"))
    schedule_steps: int = setting(0, ge=0, le=10**15, why="0: the run's limit in agent.schedule_unit")
    # Train steps between target-network copies.
    target_update: int = setting(250, ge=1)
    # The gradient's global norm is clipped to this before each step.
    grad_clip: float = setting(10.0, gt=0)
    # Clip each reward to [-reward_clip, reward_clip] before the n-step return (0: no clipping).
    # Episode returns are always reported unclipped.
    reward_clip: float = setting(0.0, ge=0, why="0: no clipping")
    device: str = setting("auto", choices=("auto", "cpu", "cuda"))
    torch_threads: int = setting(1, ge=1, le=1024)
    # "bf16": the learner's forward and backward passes run under bfloat16 autocast (weights,
    # optimizer, targets and loss stay float32). Faster on CPUs with AMX/AVX-512 BF16; slower on
    # CPUs without them, and on an H200 for the Nature CNN at batches up to 512 (0.90x and 0.82x of
    # fp32: docs/performance.md, the GPU check). "auto": bf16 where the device has it natively.
    precision: str = setting("fp32", choices=("fp32", "bf16", "auto"))


@dataclass
class ReplayConfig:
    architecture: str = setting("proposed", choices=("proposed", "baseline"))
    # Slots per replay memory: per buffer rank (proposed) and per buffer on the learner (baseline).
    capacity: int = setting(50_000, ge=1, le=2**31 - 1)
    # Learner batch N; with R buffers each serves N/R.
    batch_size: int = setting(64, ge=1, le=1_000_000)
    alpha: float = setting(0.6, ge=0, le=10)
    beta: float = setting(0.4, ge=0, le=1)
    beta_final: float = setting(1.0, ge=0, le=1)
    beta_steps: int = setting(20_000, ge=1)
    # Experiences a memory must hold before the learner samples from it.
    learning_starts: int = setting(1_000, ge=0)
    # Baseline: train batches between wholesale replay refreshes.
    n_replay: int = setting(128, ge=1)
    shares: str = setting("even", choices=("even", "rate"))
    priority_eps: float = setting(1e-6, gt=0, le=1)
    # Trained samples per inserted experience (Reverb's samples-per-insert): actors wait for the
    # learner when they are ahead of it. 0 lets actors run free, as in Ape-X.
    samples_per_insert: float = setting(0.0, ge=0, le=1e6, why="0: actors run free")
    # Keep each distinct image frame once (Atari: ~7 KB a slot instead of 56 KB for obs + next_obs
    # stacks); baseline dumps then carry each frame once too. No effect on vector observations.
    dedup_frames: bool = setting(True)
    # Frames per buffer the learner keeps of those the buffer sent it (proposed placement, frames once): a
    # sampled reply then carries only the batch's frames the learner does not hold (mpirl/replay/frame_cache.py).
    # The learner holds buffers x frame_cache frames (about 7 KB each for Atari) on its device.
    frame_cache: int = setting(0, ge=0, le=2**26, why="0: off; used with replay.architecture = proposed and "
                               "image frames stored once, no effect otherwise")


@dataclass
class LinkConfig:
    """Emulated long-haul link on the buffer <-> learner path (both directions, every message).

    A message of B bytes leaves when the link is free, occupies it for
    B / bandwidth, and arrives ``latency_ms`` later. 0 disables either part.
    """
    bandwidth_gbps: float = setting(0.0, ge=0, le=1e6, why="0: unlimited")
    latency_ms: float = setting(0.0, ge=0, le=60_000, why="0: none")
    # "zstd": compress requests, batches and dumps on this link (parameter broadcasts stay raw).
    compression: str = setting("none", choices=("none", "zstd"))
    level: int = setting(1, ge=1, le=22, why="zstd's levels")


@dataclass
class CommConfig:
    # Experiences per actor -> buffer message.
    send_batch: int = setting(50, ge=1, le=1_000_000)
    # Send buffers per actor, recycled when the send completes.
    send_ring: int = setting(4, ge=1, le=1024)
    # Receive buffers per actor, pre-posted on the buffer rank.
    recv_depth: int = setting(2, ge=1, le=1024)
    # Train batches between parameter broadcasts.
    n_update: int = setting(16, ge=1)
    # Batch requests in flight while the learner trains (proposed).
    prefetch: int = setting(2, ge=0, le=1024)
    # Largest single MPI message on the buffer -> learner path; bigger replies (baseline dumps)
    # travel as several pieces. MPI counts are 32-bit, so it must stay below 2048.
    max_message_mb: float = setting(1024.0, gt=0, lt=2048, why="MiB; MPI counts are 32-bit")
    link: LinkConfig = field(default_factory=LinkConfig)


@dataclass
class LogConfig:
    interval: float = setting(1.0, gt=0, le=86_400, why="seconds between metric rows")
    flush_seconds: float = setting(2.0, gt=0, le=10, why="so a killed job leaves recent data")
    # A line of progress (steps, rate, recent return, time left where a limit bounds the run) every this many
    # seconds while the job runs: redrawn in place by `mpirl launch` on a terminal, appended as plain lines to a
    # file (a Slurm job's output). 0: off.
    progress_seconds: float = setting(10.0, ge=0, le=86_400, why="0: off")
    # Rank 0 also writes TensorBoard event files beside run.h5 (RUN_DIR/tensorboard/) as the job runs: the
    # tensorboard extra.
    tensorboard: bool = setting(False)


@dataclass
class CheckpointConfig:
    # The learner's state (networks, optimizer, counters, RNG) every this many seconds of the job
    # and/or train steps (0 turns either off); always when the job stops, preempted or finished.
    every_seconds: float = setting(900.0, ge=0, why="0: off")
    every_steps: int = setting(0, ge=0, why="0: off")
    keep: int = setting(2, ge=1, le=1_000_000, why="the newest is what --resume needs")
    # Also each buffer's replay memory when the job stops (RUN_DIR/checkpoints/replay-<rank>.npz), so a
    # resumed run starts with it instead of refilling; about the memory's size on disk.
    replay: bool = setting(False)


def check_recurrent(cfg) -> None:
    """A recurrent policy's value reads its core: the value shares the torso."""
    if cfg.agent.recurrent != "none" and not cfg.agent.shared_torso:
        raise ConfigError("agent.shared_torso", "a recurrent policy's value reads its LSTM core, so it shares the "
                                                "torso: set agent.shared_torso = true (or agent.recurrent = \"none\")")


def check_schedules(cfg, finals: dict[str, float]) -> None:
    """A schedule that moves (a ``*_final`` that is not nan; ``finals``: its key -> value) needs a horizon
    (``agent.schedule_steps`` or the run's limit in ``agent.schedule_unit``) that ends within the run's."""
    moving = [key for key, value in finals.items() if not math.isnan(value)]
    if not moving:
        return
    a = cfg.agent
    limit = getattr(cfg.run, a.schedule_unit)
    if not a.schedule_steps and not limit:
        raise ConfigError("agent.schedule_steps", f"{moving[0]} schedules a change, over run.{a.schedule_unit} "
                                                  f"(agent.schedule_unit), and this run sets no run.{a.schedule_unit}:"
                                                  f" set agent.schedule_steps, or run.{a.schedule_unit}")
    if limit and a.schedule_steps > limit:
        raise ConfigError("agent.schedule_steps", f"the schedules end at {a.schedule_steps} {a.schedule_unit}, after "
                                                  f"the run's end at run.{a.schedule_unit} = {limit}: their final "
                                                  f"values would never be reached; set agent.schedule_steps <= "
                                                  f"{limit} (0: the run's)")
