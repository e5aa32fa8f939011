"""The one place that wires the distributed job: checks, topology, run directory, roles.

Every rank runs :func:`run_job`. Checks that can fail (world size, environment)
run on every rank before the first message, so a bad job exits with code 2 on
all ranks without a collective left waiting.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import mpirl
from mpirl.comm.backoff import wait_until
from mpirl.comm.topology import ACTOR, BUFFER, LEARNER, build
from mpirl.config import ConfigError, JobConfig
from mpirl.metrics.run_file import create_run_file, finish_run_file, link_rank_files
from mpirl.metrics.summary import format_summary, summarize
from mpirl.roles.actor import run_actor
from mpirl.roles.buffer import run_buffer
from mpirl.roles.checks import check_job
from mpirl.roles.context import RoleContext
from mpirl.roles.learner import run_learner


def new_run_dir(cfg: JobConfig) -> Path:
    """A fresh directory ``out_dir/name-YYYYmmdd-HHMMSS[-k]``; never reuses an existing one."""
    base = Path(cfg.run.out_dir) / f"{cfg.run.name}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    Path(cfg.run.out_dir).mkdir(parents=True, exist_ok=True)
    for k in range(1000):
        path = base if k == 0 else base.with_name(f"{base.name}-{k}")
        try:
            path.mkdir()
            return path.resolve()
        except FileExistsError:
            continue
    raise ConfigError("run.out_dir", f"cannot find a free run directory under {cfg.run.out_dir}")


def _git_commit() -> str:
    here = Path(mpirl.__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def provenance(world: MPI.Comm, hosts: list[str]) -> dict:
    import gymnasium
    import torch
    import mpi4py
    return {
        "package_version": mpirl.__version__, "git_commit": _git_commit(), "world_size": world.size,
        "hosts": ",".join(sorted(set(hosts))), "rank_hosts": ",".join(hosts),
        "mpi_library": MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip(),
        "mpi4py": mpi4py.__version__, "torch": str(torch.__version__), "numpy": np.__version__,
        "gymnasium": gymnasium.__version__, "python": platform.python_version(),
        "start_time": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv), "cwd": os.getcwd(), "user": getpass.getuser(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
    }


def _agree_on_local_checks(world: MPI.Comm, cfg: JobConfig) -> None:
    """Checks whose answer depends on the rank's node; every rank learns the first failure."""
    problem = None
    if world.rank == 0 and cfg.agent.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            problem = ("agent.device", f"'cuda' but the learner's node ({MPI.Get_processor_name()}) has no usable "
                       "CUDA device; use 'auto' (CUDA when present) or 'cpu'")
    problems = [p for p in world.allgather(problem) if p]
    if problems:
        raise ConfigError(*problems[0])


def _shared_run_dir(world: MPI.Comm, cfg: JobConfig) -> Path:
    """Rank 0 makes the directory; everyone gets its path or the same error."""
    result = None
    if world.rank == 0:
        try:
            result = str(new_run_dir(cfg))
        except ConfigError as err:
            result = err
        except OSError as err:
            result = ConfigError("run.out_dir", f"cannot create a run directory under {cfg.run.out_dir!r}: {err}")
    result = world.bcast(result)
    if isinstance(result, ConfigError):
        raise result
    return Path(result)


def run_job(cfg: JobConfig, job_text: str, job_path: str, quiet: bool = False) -> int:
    world = MPI.COMM_WORLD
    obs_shape, obs_dtype, n_actions = check_job(cfg, world.size, job_path)
    _agree_on_local_checks(world, cfg)
    t0 = world.bcast(time.time())
    run_dir = _shared_run_dir(world, cfg)
    topo = build(world, cfg.topology.buffers, cfg.topology.node_local)
    if world.rank == 0:
        create_run_file(run_dir, job_text, cfg.flat(), provenance(world, topo.hosts))
        link_rank_files(run_dir, {"learner": "learner.h5",
                                  **{f"buffer_{b}": f"buffer_{b}.h5" for b in topo.buffers}})
        print(f"mpirl: run directory {run_dir}", flush=True)
    ctx = RoleContext(cfg=cfg, topo=topo, run_dir=run_dir, obs_shape=obs_shape, obs_dtype=obs_dtype,
                      n_actions=n_actions, t0=t0)
    role = {LEARNER: run_learner, BUFFER: run_buffer, ACTOR: run_actor}[topo.role]
    try:
        stop_reason = role(ctx)
    except BaseException as err:
        if world.rank == 0:  # the caller aborts the job; the run must not look finished
            finish_run_file(run_dir, "failed", error=f"{type(err).__name__}: {err}", wall_seconds=time.time() - t0)
        raise
    # Every rank has closed its files and completed its requests; wait for all, politely.
    barrier = world.Ibarrier()
    wait_until(barrier.Test, first=1e-3, longest=20e-3)
    topo.free()
    if world.rank == 0:
        finish_run_file(run_dir, "completed", stop_reason=stop_reason or "", wall_seconds=time.time() - t0)
        if not quiet:
            print(format_summary(summarize(run_dir)), flush=True)
    return 0
