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
import importlib
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

from mpirl.domain import Domain, problem, setting

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A bad job: ``key`` names the offending field, ``str(err)`` says the fix."""

    def __init__(self, key: str, message: str):
        self.key, self.message = key, message
        super().__init__(f"{key}: {message}" if key else message)

    def __reduce__(self):  # survives pickling, e.g. a broadcast from rank 0 to every rank
        return type(self), (self.key, self.message)


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
    buffers: int = setting(1, ge=1, le=4096)
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


@dataclass
class EnvConfig:
    id: str = setting("CartPole-v1", text=True)
    envs_per_actor: int = setting(1, ge=1, le=4096)
    # 0 keeps the environment's own time limit.
    max_episode_steps: int = setting(0, ge=0, why="0 keeps the environment's limit")
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
    n_step: int = setting(3, ge=1, le=1000)
    lr: float = setting(1e-3, gt=0)
    adam_eps: float = setting(1e-8, gt=0)
    hidden: list = setting([128, 128], items=Domain(ge=1, le=1_000_000),
                           why="layer widths such as [128, 128]")
    # Train steps between target-network copies.
    target_update: int = setting(250, ge=1)
    # The gradient's global norm is clipped to this before each step.
    grad_clip: float = setting(10.0, gt=0)
    # Clip each reward to [-reward_clip, reward_clip] before the n-step return (0: no clipping).
    # Episode returns are always reported unclipped.
    reward_clip: float = setting(0.0, ge=0, why="0: no clipping")
    # Ape-X exploration: actor i of N uses epsilon ** (1 + epsilon_alpha * i / (N - 1)); with
    # several games per actor, each game counts as one Ape-X actor (game j of actor i is i*k + j).
    epsilon: float = setting(0.4, ge=0, le=1)
    epsilon_alpha: float = setting(7.0, ge=0, le=1000)
    device: str = setting("auto", choices=("auto", "cpu", "cuda"))
    torch_threads: int = setting(1, ge=1, le=1024)
    # "bf16": the learner's forward and backward passes run under bfloat16 autocast (weights,
    # optimizer, targets and loss stay float32). Faster on CPUs with AMX/AVX-512 BF16 and on
    # recent GPUs; slower on CPUs without them. "auto": bf16 where the device has it natively.
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
    # Episode replay (QMIX): "uniform" picks, or AccMER's reuse of the highest-weight episodes for a window of
    # floor(d / b) train steps plus (1 - accmer_alpha) * b uniform picks (needs qmix.loss_weights = "macpo").
    sampler: str = setting("uniform", choices=("uniform", "accmer"))
    accmer_alpha: float = setting(0.5, ge=0, le=1, why="the reused share of a batch")
    accmer_discount: float = setting(0.8, gt=0, le=1, why="every weight is multiplied by it after each step")


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


class _Job:
    """What every job has beside its sections (the dataclass itself is built below, see ``JobConfig``)."""

    @property
    def world_size(self) -> int:
        """Ranks the job needs; with ``topology.actors = 0``, two actors per buffer (or per worker) by default
        (an algorithm with another layout says its own: ``world_size(cfg)`` in its settings)."""
        own = getattr(SETTINGS[self.agent.algorithm], "world_size", None)
        if own is not None:
            return own(self)
        t = self.topology
        return 1 + t.buffers + t.worker_ranks + (t.actors or 2 * (t.worker_ranks or t.buffers))

    def flat(self) -> dict:
        """``{"section.key": value}`` (``"comm.link.latency_ms"`` for nested tables) for HDF5 attributes and
        checkpoints: every key the job's algorithm reads (another algorithm's settings are left out)."""
        def walk(obj, prefix):
            for f in dataclasses.fields(obj):
                value = getattr(obj, f.name)
                if dataclasses.is_dataclass(value):
                    yield from walk(value, f"{prefix}{f.name}.")
                else:
                    yield f"{prefix}{f.name}", value
        return {k: v for k, v in walk(self, "") if reads(self.agent.algorithm, k)}


SHARED = {"run": RunConfig, "topology": TopologyConfig, "env": EnvConfig, "agent": AgentConfig,
          "replay": ReplayConfig, "comm": CommConfig, "log": LogConfig, "checkpoint": CheckpointConfig}
# Each algorithm's settings module (mpirl/algos/<name>/settings.py, standard library and mpirl.domain only)
# declares the sections it owns (SECTIONS) and the keys of the shared sections it reads (USES).
SETTINGS = {name: importlib.import_module(f"mpirl.algos.{name}.settings") for name in ALGORITHMS}
OWNER = {section: name for name, mod in SETTINGS.items() for section in mod.SECTIONS}
# Sections every algorithm reads whole, and the keys every algorithm reads; any other key of the shared sections
# that the job's algorithm does not list in its USES is refused.
GENERIC = ("log",)
COMMON = ("run.name", "run.seed", "run.out_dir")

# The whole job: the shared sections, then every algorithm's own (filled with defaults when absent).
JobConfig = dataclasses.make_dataclass(
    "JobConfig",
    [(name, kind, field(default_factory=kind)) for name, kind in
     [*SHARED.items(), *((s, k) for mod in SETTINGS.values() for s, k in mod.SECTIONS.items())]],
    bases=(_Job,))
JobConfig.__module__ = __name__


def _close(word: str, options) -> str:
    near = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean '{near[0]}'?)" if near else ""


def _coerce(key: str, value, kind):
    """Ints widen to floats; everything else is held against its domain in :func:`validate`."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
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
    validate(cfg, given=list(_leaves(data)))
    return cfg


def _leaves(data: dict, prefix: str = ""):
    """The dotted keys a job file (with its overrides) sets."""
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


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
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError("", f"{path}: not UTF-8 text (byte {err.start} is 0x{err.object[err.start]:02x}); "
                              "a job file is TOML, e.g. jobs/cartpole.toml") from None
    except OSError as err:
        raise ConfigError("", f"{path}: cannot read the job file ({err.strerror})") from None
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


def fields_with_domains(obj=None, prefix: str = ""):
    """``(dotted key, type, Domain, value)`` for every field of every section (of ``obj``, default a JobConfig)."""
    obj = JobConfig() if obj is None else obj
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            yield from fields_with_domains(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", hints[f.name], f.metadata["domain"], value


def validate(cfg: JobConfig, given=()) -> None:
    """Every field against its declared domain; then the keys the job sets (``given``) that its algorithm does
    not read; then the values that cannot work together, each with its fix."""
    for key, kind, dom, value in fields_with_domains(cfg):
        what = problem(value, kind, dom)
        if what:
            raise ConfigError(key, what)
    for key in given:
        _check_owner(cfg.agent.algorithm, key)
    SETTINGS[cfg.agent.algorithm].check(cfg)


def check_replay_job(cfg: JobConfig) -> None:
    """The checks every replay-based algorithm's job needs: a stop condition, and a learner-buffer-actor layout
    that can work (called from their settings' ``check``)."""
    r, t, rp = cfg.run, cfg.topology, cfg.replay
    _need(r.train_steps or r.env_steps or r.wall_seconds, "run",
          "set at least one stop condition: run.train_steps, run.env_steps or run.wall_seconds")
    _need(not t.on_learner or t.buffers == 1, "topology.buffers",
          f"must be 1 with topology.workers = 'learner' (the learner's rank is the one worker and sends its "
          f"experience to one buffer), got {t.buffers}; set topology.buffers = 1, or use K worker ranks "
          f"(topology.workers = K >= {t.buffers})")
    _need(t.on_learner or t.workers == 0 or t.workers >= t.buffers, "topology.workers",
          f"must be 0 or >= topology.buffers ({t.buffers}) so each buffer has a worker sending to it, "
          f"got {t.workers}")
    _need(t.actors == 0 or t.actors >= (t.worker_ranks or t.buffers), "topology.actors",
          f"must be 0 (every remaining rank) or >= topology.{'workers' if t.worker_ranks else 'buffers'} "
          f"({t.worker_ranks or t.buffers}) so each {'worker' if t.worker_ranks else 'buffer'} has an actor, "
          f"got {t.actors}")
    _need(rp.batch_size >= t.buffers, "replay.batch_size",
          f"must be >= topology.buffers ({t.buffers}) so every buffer serves a share, got {rp.batch_size}")
    share = math.ceil(rp.batch_size / t.buffers)
    _need(rp.capacity >= share, "replay.capacity",
          f"must hold at least one batch share ({share}), got {rp.capacity}")
    _need(rp.learning_starts <= rp.capacity * t.buffers, "replay.learning_starts",
          f"must be between 0 and the total capacity {rp.capacity * t.buffers}, got {rp.learning_starts}")


def reads(algorithm: str, key: str) -> bool:
    """Whether ``algorithm`` reads the setting ``key`` (``"agent.n_step"``, ``"comm.link.latency_ms"``)."""
    section, rest = key.split(".", 1) if "." in key else (key, "")
    if (section in GENERIC or key in COMMON or key == "agent.algorithm"
            or section in SETTINGS[algorithm].SECTIONS):
        return True
    if section in OWNER:
        return False
    return any(rest == k or rest.startswith(k + ".") for k in SETTINGS[algorithm].USES.get(section, ()))


def _check_owner(algorithm: str, key: str) -> None:
    """``key`` (set by the job) must be one the job's algorithm reads: its own sections, the generic ones, or
    the keys of the shared sections it lists in USES."""
    section, rest = key.split(".", 1) if "." in key else (key, "")
    uses = SETTINGS[algorithm].USES
    if reads(algorithm, key):
        return
    if section in OWNER:
        raise ConfigError(key, f"[{section}] belongs to agent.algorithm = '{OWNER[section]}' and this job runs "
                               f"'{algorithm}'; set agent.algorithm = '{OWNER[section]}' or remove [{section}]")
    users = [name for name, mod in SETTINGS.items()
             if any(rest == k or rest.startswith(k + ".") for k in mod.USES.get(section, ()))]
    whose = f" (a setting of {' and '.join(map(repr, users))})" if users else ""
    raise ConfigError(key, f"agent.algorithm = '{algorithm}' does not use it{whose}; remove it. "
                           f"'{algorithm}' reads [{section}] {', '.join(uses.get(section, ())) or 'nothing'}")


def actor_count(cfg: JobConfig, size: int) -> int:
    """Actor ranks in a world of ``size`` ranks."""
    return cfg.topology.actors or size - 1 - cfg.topology.buffers - cfg.topology.worker_ranks


def check_world_size(cfg: JobConfig, size: int, job_path: str = "JOB.toml") -> None:
    """The MPI world must hold the learner, every buffer, every worker, and the job's actors (at least one per
    worker, or per buffer without workers)."""
    t = cfg.topology
    fixed = 1 + t.buffers + t.worker_ranks
    roles = (f"1 learner{' (the worker)' if t.on_learner else ''} + {t.buffers} buffer(s)"
             + (f" + {t.worker_ranks} worker(s)" if t.worker_ranks else ""))
    per = "worker" if t.worker_ranks else "buffer"
    if t.actors:
        if size == fixed + t.actors:
            return
        need, what = fixed + t.actors, f"{roles} + {t.actors} actor(s)"
    else:
        if size >= fixed + (t.worker_ranks or t.buffers):
            return
        need, what = cfg.world_size, f"{roles} + at least one actor per {per}"
    hint = f"run: mpirl launch -n {need} {job_path}  (or mpiexec -n {need} mpirl run {job_path})"
    raise ConfigError("world size", f"the job needs {what}, the MPI world has {size} rank(s); {hint}")
