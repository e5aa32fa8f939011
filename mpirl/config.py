"""Typed job configuration: TOML job files, ``--set`` overrides, validation.

A job file is the whole experiment. Every section is a dataclass below; the
field's annotation is its type and its default is used when the job file omits
it. Unknown keys, wrong types and impossible values raise :class:`ConfigError`
naming the key and the fix; the command line turns that into one line and exit
code 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A bad job: ``key`` names the offending field, ``str(err)`` says the fix."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


@dataclass
class RunConfig:
    name: str = "run"
    seed: int = 0
    out_dir: str = "runs"
    # Stop conditions: the job stops at the first one reached; 0 disables one.
    train_steps: int = 0
    env_steps: int = 0
    wall_seconds: float = 0.0
    # Stop once the mean return of the last `return_window` episodes reaches this (nan: never).
    target_return: float = math.nan
    return_window: int = 20
    # Whose episodes that window (and the learner's return_mean20) holds: "all" actors', or
    # "least_exploring": only the last actor rank's (the smallest Ape-X epsilons; an evaluator's
    # view, since an actor playing 40 % random actions may never reach a high target).
    return_from: str = "all"


@dataclass
class TopologyConfig:
    buffers: int = 1
    # Actor ranks in all; 0: every rank after the learner and the buffers is an actor.
    # Actors are spread over the buffers as evenly as possible.
    actors: int = 0
    # Put each buffer's actors on the buffer's own node where the allocation allows it.
    node_local: bool = True


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    envs_per_actor: int = 1
    # 0 keeps the environment's own time limit.
    max_episode_steps: int = 0
    # Atari ("ALE/<Game>-v5" ids, ale-py's native vector env): DQN/Ape-X preprocessing.
    frameskip: int = 4
    frame_stack: int = 4
    noop_max: int = 30
    repeat_action_probability: float = 0.0
    env_threads: int = 1
    # A lost life cuts the n-step bootstrap like a terminal (DQN/Ape-X practice); episodes go on.
    terminal_on_life_loss: bool = True
    # Press FIRE after a lost life, as the reset does (games that need it to go on, e.g. Breakout).
    fire_on_life_loss: bool = True


@dataclass
class AgentConfig:
    gamma: float = 0.99
    n_step: int = 3
    lr: float = 1e-3
    adam_eps: float = 1e-8
    hidden: list = field(default_factory=lambda: [128, 128])
    # Train steps between target-network copies.
    target_update: int = 250
    grad_clip: float = 10.0
    # Clip each reward to [-reward_clip, reward_clip] before the n-step return (0: no clipping).
    # Episode returns are always reported unclipped.
    reward_clip: float = 0.0
    # Ape-X exploration: actor i of N uses epsilon ** (1 + epsilon_alpha * i / (N - 1)); with
    # several games per actor, each game counts as one Ape-X actor (game j of actor i is i*k + j).
    epsilon: float = 0.4
    epsilon_alpha: float = 7.0
    device: str = "auto"
    torch_threads: int = 1
    # "bf16": the learner's forward and backward passes run under bfloat16 autocast (weights,
    # optimizer, targets and loss stay float32). Faster on CPUs with AMX/AVX-512 BF16 and on
    # recent GPUs; slower on CPUs without them. "auto": bf16 where the device has it natively.
    precision: str = "fp32"


@dataclass
class ReplayConfig:
    architecture: str = "proposed"
    # Slots per replay memory: per buffer rank (proposed) and per buffer on the learner (baseline).
    capacity: int = 50_000
    # Learner batch N; with R buffers each serves N/R.
    batch_size: int = 64
    alpha: float = 0.6
    beta: float = 0.4
    beta_final: float = 1.0
    beta_steps: int = 20_000
    # Experiences a memory must hold before the learner samples from it.
    learning_starts: int = 1_000
    # Baseline: train batches between wholesale replay refreshes.
    n_replay: int = 128
    shares: str = "even"
    priority_eps: float = 1e-6
    # Trained samples per inserted experience (Reverb's samples-per-insert): actors wait for the
    # learner when they are ahead of it. 0 lets actors run free, as in Ape-X.
    samples_per_insert: float = 0.0
    # Keep each distinct image frame once (Atari: ~7 KB a slot instead of 56 KB for obs + next_obs
    # stacks); baseline dumps then carry each frame once too. No effect on vector observations.
    dedup_frames: bool = True


@dataclass
class LinkConfig:
    """Emulated long-haul link on the buffer <-> learner path (both directions, every message).

    A message of B bytes leaves when the link is free, occupies it for
    B / bandwidth, and arrives ``latency_ms`` later. 0 disables either part.
    """
    bandwidth_gbps: float = 0.0
    latency_ms: float = 0.0
    # "zstd": compress requests, batches and dumps on this link (parameter broadcasts stay raw).
    compression: str = "none"
    level: int = 1


@dataclass
class CommConfig:
    # Experiences per actor -> buffer message.
    send_batch: int = 50
    # Send buffers per actor, recycled when the send completes.
    send_ring: int = 4
    # Receive buffers per actor, pre-posted on the buffer rank.
    recv_depth: int = 2
    # Train batches between parameter broadcasts.
    n_update: int = 16
    # Batch requests in flight while the learner trains (proposed).
    prefetch: int = 2
    # Largest single MPI message on the buffer -> learner path; bigger replies (baseline dumps)
    # travel as several pieces. MPI counts are 32-bit, so it must stay below 2048.
    max_message_mb: float = 1024.0
    link: LinkConfig = field(default_factory=LinkConfig)


@dataclass
class LogConfig:
    interval: float = 1.0
    flush_seconds: float = 2.0


@dataclass
class CheckpointConfig:
    # The learner's state (networks, optimizer, counters, RNG) every this many seconds of the job
    # and/or train steps (0 turns either off); always when the job stops, preempted or finished.
    every_seconds: float = 900.0
    every_steps: int = 0
    keep: int = 2  # newest checkpoints kept in RUN_DIR/checkpoints
    # Also each buffer's replay memory when the job stops (RUN_DIR/checkpoints/replay-<rank>.npz), so a
    # resumed run starts with it instead of refilling; about the memory's size on disk.
    replay: bool = False


@dataclass
class JobConfig:
    run: RunConfig = field(default_factory=RunConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    @property
    def world_size(self) -> int:
        """Ranks the job needs; with ``topology.actors = 0``, two actors per buffer by default."""
        t = self.topology
        return 1 + t.buffers + (t.actors or 2 * t.buffers)

    def flat(self) -> dict:
        """``{"section.key": value}`` (``"comm.link.latency_ms"`` for nested tables) for HDF5 attributes."""
        def walk(obj, prefix):
            for f in dataclasses.fields(obj):
                value = getattr(obj, f.name)
                if dataclasses.is_dataclass(value):
                    yield from walk(value, f"{prefix}{f.name}.")
                else:
                    yield f"{prefix}{f.name}", value
        return dict(walk(self, ""))


_SECTIONS = {f.name: f.type for f in dataclasses.fields(JobConfig)}
_CHOICES = {
    "run.return_from": ("all", "least_exploring"),
    "replay.architecture": ("proposed", "baseline"),
    "replay.shares": ("even", "rate"),
    "agent.device": ("auto", "cpu", "cuda"),
    "agent.precision": ("fp32", "bf16", "auto"),
    "comm.link.compression": ("none", "zstd"),
}


def _close(word: str, options) -> str:
    near = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean '{near[0]}'?)" if near else ""


def _coerce(key: str, value, kind):
    """Check ``value`` against the annotated ``kind``; ints widen to floats."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is list:
        if not isinstance(value, list):
            raise ConfigError(key, f"must be a list, got {value!r}")
        return value
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(key, f"must be {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _fill(obj, body: dict, prefix: str) -> None:
    """Set the fields of dataclass ``obj`` from ``body``; nested tables fill nested dataclasses."""
    types = typing.get_type_hints(type(obj))
    for key, value in body.items():
        full = f"{prefix}.{key}" if prefix else key
        if key not in types:
            where = f"[{prefix}] takes" if prefix else "sections are"
            raise ConfigError(full, f"unknown {'key' if prefix else 'section'}{_close(key, types)}; "
                              f"{where} {', '.join(types)}")
        if dataclasses.is_dataclass(types[key]):
            if not isinstance(value, dict):
                raise ConfigError(full, f"must be a table [{full}]")
            _fill(getattr(obj, key), value, full)
        else:
            setattr(obj, key, _coerce(full, value, types[key]))


def from_dict(data: dict) -> JobConfig:
    """Build a JobConfig from nested dicts (a parsed TOML), checking every key."""
    cfg = JobConfig()
    _fill(cfg, data, "")
    validate(cfg)
    return cfg


def parse_override(text: str) -> tuple[str, object]:
    """``"a.b=v"`` -> ``("a.b", v)``; v is read as a TOML value, else as a bare string."""
    if "=" not in text:
        raise ConfigError(text, "an override is section.key=value, e.g. replay.architecture=baseline")
    key, raw = (s.strip() for s in text.split("=", 1))
    if key.count(".") < 1 or not all(key.split(".")):
        raise ConfigError(key, "an override key is section.key, e.g. topology.buffers or comm.link.latency_ms")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def load(path: str | Path, overrides: typing.Sequence[str] = ()) -> tuple[JobConfig, str]:
    """Read a job file, apply ``--set`` overrides, validate. Returns (config, job text)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("", f"job file {str(path)!r} not found; pass a TOML job such as jobs/cartpole.toml")
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError("", f"{path}: not valid TOML ({err})") from None
    for item in overrides:
        key, value = parse_override(item)
        *tables, name = key.split(".")
        table = data
        for depth, sec in enumerate(tables):
            table = table.setdefault(sec, {})
            if not isinstance(table, dict):
                raise ConfigError(".".join(tables[:depth + 1]), f"must be a table [{'.'.join(tables[:depth + 1])}]")
        table[name] = value
    return from_dict(data), text


def _need(ok: bool, key: str, message: str):
    if not ok:
        raise ConfigError(key, message)


def validate(cfg: JobConfig) -> None:
    """Values that cannot work, each named with its fix."""
    for key, choices in _CHOICES.items():
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        _need(value in choices, key, f"must be one of {', '.join(map(repr, choices))}, got {value!r}")
    r, t, a, rp, c, lg = cfg.run, cfg.topology, cfg.agent, cfg.replay, cfg.comm, cfg.log
    _need(bool(r.name) and "/" not in r.name, "run.name", "must be a non-empty name without '/'")
    for key, value in (("run.train_steps", r.train_steps), ("run.env_steps", r.env_steps),
                       ("run.wall_seconds", r.wall_seconds)):
        _need(value >= 0, key, f"must be >= 0 (0 disables it), got {value}")
    _need(r.train_steps or r.env_steps or r.wall_seconds, "run",
          "set at least one stop condition: run.train_steps, run.env_steps or run.wall_seconds")
    _need(r.return_window >= 1, "run.return_window", f"must be >= 1, got {r.return_window}")
    _need(t.buffers >= 1, "topology.buffers", f"must be >= 1, got {t.buffers}")
    _need(t.actors == 0 or t.actors >= t.buffers, "topology.actors",
          f"must be 0 (every remaining rank) or >= topology.buffers ({t.buffers}) so each buffer has an actor, "
          f"got {t.actors}")
    _need(cfg.env.envs_per_actor >= 1, "env.envs_per_actor", f"must be >= 1, got {cfg.env.envs_per_actor}")
    _need(cfg.env.max_episode_steps >= 0, "env.max_episode_steps", "must be >= 0 (0 keeps the env's limit)")
    _need(a.reward_clip >= 0, "agent.reward_clip", f"must be >= 0 (0: no clipping), got {a.reward_clip}")
    _need(0.0 < a.gamma <= 1.0, "agent.gamma", f"must be in (0, 1], got {a.gamma}")
    _need(a.n_step >= 1, "agent.n_step", f"must be >= 1, got {a.n_step}")
    _need(a.lr > 0, "agent.lr", f"must be > 0, got {a.lr}")
    _need(len(a.hidden) >= 1 and all(isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in a.hidden),
          "agent.hidden", f"must be a list of positive layer widths such as [128, 128], got {a.hidden!r}")
    _need(a.target_update >= 1, "agent.target_update", f"must be >= 1, got {a.target_update}")
    _need(0.0 <= a.epsilon <= 1.0, "agent.epsilon", f"must be in [0, 1], got {a.epsilon}")
    _need(a.epsilon_alpha >= 0, "agent.epsilon_alpha", f"must be >= 0, got {a.epsilon_alpha}")
    _need(a.torch_threads >= 1, "agent.torch_threads", f"must be >= 1, got {a.torch_threads}")
    _need(rp.batch_size >= t.buffers, "replay.batch_size",
          f"must be >= topology.buffers ({t.buffers}) so every buffer serves a share, got {rp.batch_size}")
    share = math.ceil(rp.batch_size / t.buffers)
    _need(rp.capacity >= share, "replay.capacity",
          f"must hold at least one batch share ({share}), got {rp.capacity}")
    _need(0 <= rp.learning_starts <= rp.capacity * t.buffers, "replay.learning_starts",
          f"must be between 0 and the total capacity {rp.capacity * t.buffers}, got {rp.learning_starts}")
    _need(rp.alpha >= 0, "replay.alpha", f"must be >= 0, got {rp.alpha}")
    _need(rp.samples_per_insert >= 0 and math.isfinite(rp.samples_per_insert), "replay.samples_per_insert",
          f"must be a number >= 0 (0: actors run free), got {rp.samples_per_insert}")
    _need(0 <= rp.beta <= 1 and 0 <= rp.beta_final <= 1, "replay.beta", "beta and beta_final must be in [0, 1]")
    _need(rp.beta_steps >= 1, "replay.beta_steps", f"must be >= 1, got {rp.beta_steps}")
    _need(rp.n_replay >= 1, "replay.n_replay", f"must be >= 1, got {rp.n_replay}")
    _need(rp.priority_eps > 0, "replay.priority_eps", f"must be > 0, got {rp.priority_eps}")
    _need(c.send_batch >= 1, "comm.send_batch", f"must be >= 1, got {c.send_batch}")
    _need(c.send_ring >= 1, "comm.send_ring", f"must be >= 1, got {c.send_ring}")
    _need(c.recv_depth >= 1, "comm.recv_depth", f"must be >= 1, got {c.recv_depth}")
    _need(c.n_update >= 1, "comm.n_update", f"must be >= 1, got {c.n_update}")
    _need(c.prefetch >= 0, "comm.prefetch", f"must be >= 0, got {c.prefetch}")
    _need(0 < c.max_message_mb < 2048, "comm.max_message_mb",
          f"must be in (0, 2048) MiB (MPI counts are 32-bit), got {c.max_message_mb}")
    _need(c.link.bandwidth_gbps >= 0, "comm.link.bandwidth_gbps", "must be >= 0 (0: unlimited)")
    _need(c.link.latency_ms >= 0, "comm.link.latency_ms", "must be >= 0 (0: none)")
    _need(1 <= c.link.level <= 22, "comm.link.level", f"zstd levels are 1..22, got {c.link.level}")
    ck = cfg.checkpoint
    _need(ck.every_seconds >= 0, "checkpoint.every_seconds", f"must be >= 0 (0: off), got {ck.every_seconds}")
    _need(ck.every_steps >= 0, "checkpoint.every_steps", f"must be >= 0 (0: off), got {ck.every_steps}")
    _need(ck.keep >= 1, "checkpoint.keep", f"must be >= 1 (the newest is what --resume needs), got {ck.keep}")
    _need(lg.interval > 0, "log.interval", f"must be > 0 seconds, got {lg.interval}")
    _need(0 < lg.flush_seconds <= 10, "log.flush_seconds",
          f"must be in (0, 10] so a killed job leaves recent data, got {lg.flush_seconds}")


def actor_count(cfg: JobConfig, size: int) -> int:
    """Actor ranks in a world of ``size`` ranks."""
    return cfg.topology.actors or size - 1 - cfg.topology.buffers


def check_world_size(cfg: JobConfig, size: int, job_path: str = "JOB.toml") -> None:
    """The MPI world must hold the learner, every buffer, and the job's actors (at least one per buffer)."""
    t = cfg.topology
    if t.actors:
        if size == 1 + t.buffers + t.actors:
            return
        need, what = 1 + t.buffers + t.actors, f"1 learner + {t.buffers} buffer(s) + {t.actors} actor(s)"
    else:
        if size >= 1 + 2 * t.buffers:
            return
        need, what = cfg.world_size, f"1 learner + {t.buffers} buffer(s) + at least one actor per buffer"
    hint = f"run: mpirl launch -n {need} {job_path}  (or mpiexec -n {need} mpirl run {job_path})"
    raise ConfigError("world size", f"the job needs {what}, the MPI world has {size} rank(s); {hint}")
