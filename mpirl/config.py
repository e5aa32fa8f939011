"""Typed job configuration: TOML job files, ``--set`` overrides, validation.

A job file is the whole experiment. Every section is a dataclass (the shared ones in
:mod:`mpirl.sections`, an algorithm's own in its ``settings.py``); the field's annotation
is its type and its default is used when the job file omits it. Unknown keys, wrong types and impossible values raise :class:`ConfigError`
naming the key and the fix; the command line turns that into one line and exit
code 2.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import sys
import typing
from dataclasses import field
from pathlib import Path

from mpirl.domain import ConfigError, problem  # noqa: F401 - ConfigError: the config layer's error
from mpirl.sections import (ALGORITHMS, AgentConfig, CheckpointConfig, CommConfig, EnvConfig,  # noqa: F401
                            LinkConfig, LogConfig, PredatorPreyConfig, ReplayConfig, RunConfig, TopologyConfig)

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib


class _Job:
    """What every job has beside its sections (the dataclass itself is built below, see ``JobConfig``)."""

    if typing.TYPE_CHECKING:  # the sections, for the type checker: the dataclass is made from the registry below
        run: RunConfig
        topology: TopologyConfig
        env: EnvConfig
        agent: AgentConfig
        replay: ReplayConfig
        comm: CommConfig
        log: LogConfig
        checkpoint: CheckpointConfig

        def __init__(self) -> None: ...

        def __getattr__(self, section: str) -> typing.Any: ...  # an algorithm's own section ([qmix], [distql])

    @property
    def world_size(self) -> int:
        """Ranks the job needs by default: its algorithm's settings say (``world_size(cfg)``)."""
        return SETTINGS[self.agent.algorithm].world_size(self)

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
# Keys of the shared sections that moved into an algorithm's own: old dotted key -> new one.
MOVED = {old: new for mod in SETTINGS.values() for old, new in mod.MOVED.items()}
# Sections every algorithm reads whole, and the keys every algorithm reads; any other key of the shared sections
# that the job's algorithm does not list in its USES is refused.
GENERIC = ("log",)
COMMON = ("run.name", "run.seed", "run.out_dir")

# The whole job: the shared sections, then every algorithm's own (filled with defaults when absent).
if typing.TYPE_CHECKING:
    JobConfig = _Job
else:
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
        if key not in types and full in MOVED:
            new = MOVED[full]
            raise ConfigError(full, f"moved to {new}; set it as {new.split('.', 1)[1]} under "
                                    f"[{new.split('.', 1)[0]}]")
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


def defaults(algorithm: str) -> JobConfig:
    """A job of ``algorithm`` with nothing set: the sections' defaults, with the algorithm's own (its settings'
    DEFAULTS) in place of the shared ones."""
    cfg = JobConfig()
    cfg.agent.algorithm = algorithm
    for key, value in (SETTINGS[algorithm].DEFAULTS.items() if algorithm in SETTINGS else ()):
        section, name = key.split(".", 1)
        setattr(getattr(cfg, section), name, copy.deepcopy(value))
    return cfg


def from_dict(data: dict) -> JobConfig:
    """Build a JobConfig from nested dicts (a parsed TOML), checking every key; what the job does not set is the
    default for its algorithm (:func:`defaults`)."""
    agent = data.get("agent")
    algorithm = agent.get("algorithm") if isinstance(agent, dict) else None
    cfg = defaults(algorithm if isinstance(algorithm, str) else JobConfig().agent.algorithm)
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


def reads(algorithm: str, key: str) -> bool:
    """Whether ``algorithm`` reads the setting ``key`` (``"env.id"``, ``"comm.link.latency_ms"``)."""
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
    read = [k.split(".", 1)[1] for k in COMMON if k.startswith(f"{section}.")] + list(uses.get(section, ()))
    raise ConfigError(key, f"agent.algorithm = '{algorithm}' does not use it{whose}; remove it. "
                           f"'{algorithm}' reads [{section}] {', '.join(read) or 'nothing'}")
