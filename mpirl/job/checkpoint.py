"""Checkpoints of a run and resuming from them.

Layout: ``RUN_DIR/checkpoints/ckpt-<step, 10 digits>.pt``, one file per
checkpoint, written by the learner: its networks, optimizer, counters and RNG
states, and the job time it was taken at. A file is written under a temporary
name, synced and renamed, so a file with the final name is always complete; the
newest ``checkpoint.keep`` are kept. An algorithm without torch writes HDF5 instead
(``ckpt-<step>.h5``, DistQL: its step is the server's merges) with the same header
(``identity``, ``job_time``, ``train_steps``, ``step_name``) in the root's attributes.

Buffers and actors hold no state a checkpoint needs: on resume their counters
(experiences, env steps per actor, bytes) continue from their own metrics rows
at or before the checkpoint's job time, and rows after it are dropped from every
table, so each metric continues with neither duplicated nor missing steps.
Replay memories start empty again and refill before training resumes.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from mpirl.atomic import write_atomically
from mpirl.config import MOVED, ConfigError, JobConfig
from mpirl.metrics import heartbeat
from mpirl.metrics.run_file import RUN_FILE, load_run, plain

CKPT_DIR = "checkpoints"
NAME = re.compile(r"^ckpt-(\d{10})\.(pt|h5)$")
# What a checkpoint and its run's tables look like; a change to either (a table's columns, the state saved) takes
# the next number, and a run written with another number is not resumed (the resumed ranks would append rows to
# tables of other columns). 2: the test and rollouts tables count env_errors; several learners' counts.
FORMAT = 2
# Keys a resumed job may change: when to stop, how to log, how to checkpoint, and where the networks compute (a
# checkpoint written on a GPU resumes on a CPU and the reverse: every tensor is loaded onto the resuming device).
MAY_CHANGE = ("run.train_steps", "run.env_steps", "run.wall_seconds", "run.target_return", "run.out_dir",
              "agent.device", "agent.torch_threads")
MAY_CHANGE_SECTIONS = ("log.", "checkpoint.")


def identity(cfg: JobConfig, world_size: int) -> dict:
    """What a checkpoint must agree on with the job resuming from it."""
    flat = {k: v for k, v in cfg.flat().items()
            if k not in MAY_CHANGE and not k.startswith(MAY_CHANGE_SECTIONS)}
    return {"world_size": world_size, **{k: repr(v) for k, v in flat.items()}}


def _default(key: str):
    """The default of the setting ``key`` (``"agent.activation"``), or a marker no value equals."""
    value: object = JobConfig()
    for part in key.split("."):
        value = getattr(value, part, _UNKNOWN)
    return value


_UNKNOWN = object()


def mismatch(saved: dict, current: dict) -> str:
    """'' if ``current`` may resume from ``saved``, else the first difference in words. A checkpoint written
    before a setting moved to its algorithm's section names it by its old key (config.MOVED); one written before a
    setting existed resumes where the setting is at its default (which is how that checkpoint's job ran)."""
    saved = {MOVED.get(k, k): v for k, v in saved.items()}
    saved = {k: v for k, v in saved.items()  # a checkpoint written before a key could change still names it
             if k not in MAY_CHANGE and not k.startswith(MAY_CHANGE_SECTIONS)}
    for key in sorted(set(saved) | set(current)):
        if key not in saved and key in current and current[key] == repr(_default(key)):  # identity's reprs
            continue
        if saved.get(key) != current.get(key):
            return f"{key} was {saved.get(key, 'unset')} in the checkpoint's job, is {current.get(key, 'unset')} now"
    return ""


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    d = Path(run_dir) / CKPT_DIR
    if not d.is_dir():
        return []
    numbered = ((p, NAME.match(p.name)) for p in d.iterdir())
    return [p for _, p in sorted((int(m.group(1)), p) for p, m in numbered if m)]


def chosen(run_dir: Path, given: str | Path | None = None) -> tuple[Path, str]:
    """The checkpoint a trained policy is loaded from: ``given`` (a checkpoint file), or the run's newest; and it in
    words (``ckpt-0000001244.pt (train step 1244)``). ConfigError naming what to pass when there is none."""
    if given is not None:
        path = Path(given)
        if not path.is_file() or not NAME.match(path.name):
            raise ConfigError("--checkpoint", f"{given}: not a checkpoint file (checkpoints/ckpt-<step>.pt or .h5 "
                                              f"of a run); {run_dir}/{CKPT_DIR} holds the run's")
    else:
        found = checkpoints(run_dir)
        if not found:
            raise ConfigError("RUN_DIR", f"{run_dir} has no checkpoint ({CKPT_DIR}/ckpt-*); a run writes one when it "
                                         "stops and every checkpoint.every_seconds: play a run that ran to its end")
        path = found[-1]
    try:
        head = header(path)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same answer
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError("--checkpoint", f"{path} cannot be read ({type(err).__name__}: {first})") from None
    return path, f"{path.name} ({head.get('step_name', 'train step')} {head.get('train_steps', '?')})"


def path_for(run_dir: Path, step: int, suffix: str = ".pt") -> Path:
    """Where the checkpoint of ``step`` goes (its directory made)."""
    d = Path(run_dir) / CKPT_DIR
    d.mkdir(exist_ok=True)
    return d / f"ckpt-{int(step):010d}{suffix}"


def prune(run_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints."""
    for old in checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)


def save(run_dir: Path, state: dict, keep: int) -> Path:
    """Write ``state`` as the checkpoint of ``state['train_steps']``; keep the newest ``keep``."""
    path = path_for(run_dir, state["train_steps"])
    import torch  # here, not at the top: every rank plans a resume, and a tabular job never imports torch
    with write_atomically(path) as f:
        torch.save({"format": FORMAT, **state}, f)
    prune(run_dir, keep)
    return path


def load(path: Path, map_location=None) -> dict:
    """A checkpoint's state (tensors and plain Python values only: nothing is executed)."""
    import torch
    return torch.load(path, map_location=map_location, weights_only=True)


def header(path: Path) -> dict:
    """What every checkpoint says about itself: ``format``, ``identity``, ``job_time``, ``train_steps``,
    ``step_name``."""
    if Path(path).suffix == ".h5":
        with h5py.File(path, "r", locking=False) as f:
            a = f.attrs
            return {"format": int(a.get("format", 0)), "identity": json.loads(plain(a["identity"])),
                    "job_time": float(a["job_time"]),
                    "train_steps": int(a["train_steps"]), "step_name": plain(a.get("step_name", "step"))}
    return {"step_name": "train step", **load(path, map_location="cpu")}


@dataclass
class Resume:
    """What every rank needs to continue a run (rank 0 finds it, broadcasts it)."""
    run_dir: str
    checkpoint: str
    job_time: float  # the job's clock at the checkpoint (seconds since its start)
    train_steps: int  # the checkpoint's step (DistQL: the server's merges)
    restart: int  # 1 for the first resume
    actor_steps: dict = field(default_factory=dict)  # actor rank -> env steps at the checkpoint
    step_name: str = "train step"  # what a step is, for messages

    def where(self) -> str:
        """``ckpt-0000001244.pt (train step 1244)``."""
        return f"{Path(self.checkpoint).name} ({self.step_name} {self.train_steps})"


def _actor_steps(run: dict, t: float) -> dict[int, int]:
    """Each actor's env steps at job time ``t``: the last row of its ``actors`` table at or before ``t``."""
    steps = {}
    for entry in run["files"].values():
        table = entry["tables"].get("actors", {})
        if "actor" not in table:
            continue
        for actor in np.unique(table["actor"]):
            idx = np.flatnonzero((table["time"] <= t) & (table["actor"] == actor))
            if len(idx):
                steps[int(actor)] = int(table["env_steps"][idx[-1]])
    return steps


def plan_resume(cfg: JobConfig, world_size: int, target: str) -> Resume | None:
    """Find the run and checkpoint ``--resume TARGET`` means; ConfigError naming the fix if none fits.

    ``target``: a run directory, or ``auto``: the newest unfinished run of this job
    (same ``run.name`` under ``run.out_dir``; under Slurm, the same job id first)
    with a checkpoint; ``None`` when there is none (a new run starts).
    """
    if target == "auto":
        run_dir = _newest_unfinished(cfg)
        if run_dir is None:
            return None
    else:
        run_dir = Path(target)
        if not (run_dir / RUN_FILE).is_file():
            raise ConfigError("--resume", f"{target}: no run.h5 there; pass a run directory such as "
                              f"{cfg.run.out_dir}/{cfg.run.name}-20260101-120000, or 'auto'")
        if _live(run_dir, load_run(run_dir, files=False)["run"]["attrs"]):
            raise ConfigError("--resume", f"{target} is still running (its heartbeat is fresh); stop it first "
                              "(Ctrl-C on mpirl launch, or kill -USR1 its mpiexec), or wait until it ends")
    found = checkpoints(run_dir)
    if not found:
        raise ConfigError("--resume", f"{run_dir} has no complete checkpoint ({CKPT_DIR}/ckpt-*.pt); "
                          "start a new run without --resume")
    try:
        state = header(found[-1])
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same answer
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError("--resume", f"{found[-1]} cannot be read ({type(err).__name__}: {first}); "
                          "delete it to resume from the one before, or start a new run") from None
    if state.get("format", 0) != FORMAT:
        raise ConfigError("--resume", f"{found[-1]} was written by another version of mpirl (checkpoint format "
                          f"{state.get('format', 0)}; this version reads format {FORMAT}, whose tables differ): "
                          "finish the run with the version that wrote it, or start a new run")
    why = mismatch(state.get("identity", {}), identity(cfg, world_size))
    if why:
        raise ConfigError("--resume", f"{found[-1]} belongs to another job: {why}; resume with the job and world "
                          f"size that wrote it (only {', '.join(MAY_CHANGE)}, log.* and checkpoint.* may change)")
    t = float(state["job_time"])
    run = load_run(run_dir)  # run.h5 and the rank files, read once
    restart = int(run["run"]["attrs"].get("restarts", 0)) + 1
    return Resume(str(Path(run_dir).resolve()), str(found[-1]), t, int(state["train_steps"]), restart,
                  _actor_steps(run, t), state["step_name"])


def _live(run_dir: Path, attrs: dict) -> bool:
    """run.h5's attributes ``attrs`` say running and the heartbeat agrees."""
    try:
        return attrs.get("status") == "running" and heartbeat.verdict(run_dir)[0] is True
    except OSError:
        return False


def _newest_unfinished(cfg: JobConfig) -> Path | None:
    out = Path(cfg.run.out_dir)
    if not out.is_dir():
        return None
    candidates = []
    slurm_job = os.environ.get("SLURM_JOB_ID", "")
    for run_dir in out.glob(f"{cfg.run.name}-*"):
        found = checkpoints(run_dir)
        if not found or not (run_dir / RUN_FILE).is_file():
            continue
        run = load_run(run_dir, files=False)["run"]
        if run["note"] != "ok":  # unreadable
            continue
        status, name = run["attrs"].get("status", ""), run["job"].get("run.name", "")
        job_id = str(run["provenance"].get("slurm_job_id", ""))
        if status == "completed" or name != cfg.run.name:  # "cartpole-*" also matches "cartpole-baseline-s1-*"
            continue
        if _live(run_dir, run["attrs"]):  # alive: another job is writing it
            continue
        same_job = bool(slurm_job) and job_id == slurm_job
        candidates.append((same_job, found[-1].stat().st_mtime, run_dir))
    return max(candidates)[2] if candidates else None
