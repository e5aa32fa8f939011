"""A run directory's job and checkpoint, and the trained policy they make: the first step of play, export and
:func:`mpirl.load_policy`. Every refusal is a :class:`~mpirl.config.ConfigError` naming what to pass instead."""

from __future__ import annotations

from pathlib import Path

import torch

from mpirl.config import ALGORITHMS, MOVED, ConfigError, JobConfig, from_dict
from mpirl.metrics.run_file import RUN_FILE, load_run, newest_run


def job_of(run_dir: Path) -> JobConfig:
    """The job the run ran, from run.h5's flat keys (a key that moved since is read under its new name)."""
    run = load_run(run_dir, files=False)["run"]
    flat = run["job"]
    if not flat:
        raise ConfigError("RUN_DIR", f"{run_dir}/{RUN_FILE} holds no job ({run['note'] or 'an empty job group'}); "
                                     "the run did not get far enough to write it")
    nested: dict = {}
    for key, value in flat.items():
        *sections, name = MOVED.get(key, key).split(".")
        table = nested
        for s in sections:
            table = table.setdefault(s, {})
        table[name] = value
    try:
        return from_dict(nested)
    except ConfigError as err:
        raise ConfigError("RUN_DIR", f"{run_dir}: its job cannot be read by this version of mpirl ({err}); use the "
                                     "version that wrote it (run.h5's provenance names it)") from None


def device_of(name: str) -> torch.device:
    """``cpu``, ``cuda`` (``cuda:K``) or ``auto`` (CUDA when torch sees it)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device", f"{name!r} but torch sees no CUDA device here; use cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError("--device", f"{name!r} is not a device; use cpu, cuda, cuda:K or auto") from None


def load_trained(run_dir: str | Path, checkpoint: str | Path | None = None, device: str = "cpu"):
    """``(policy, run directory)``: the run's trained policy (its algorithm's ``trained.load_policy``) from
    ``checkpoint`` (default: the newest); ``policy.source`` says which."""
    from mpirl import registry
    path = newest_run(run_dir)
    cfg = job_of(path)
    if cfg.agent.algorithm not in ALGORITHMS:
        raise ConfigError("RUN_DIR", f"{path} ran {cfg.agent.algorithm!r}, which this version does not know")
    where = device_of(device)
    try:
        policy = registry.trained(cfg.agent.algorithm).load_policy(cfg, path, checkpoint, where)
    except ConfigError:
        raise
    except (KeyError, RuntimeError, ValueError, OSError) as err:
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError("--checkpoint", f"{checkpoint or path}: does not hold the {cfg.agent.algorithm} policy the "
                                          f"run's job describes ({type(err).__name__}: {first}); it is of another "
                                          "format or another job's") from None
    return policy, path
