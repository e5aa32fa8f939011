"""The one place that wires the distributed job: checks, topology, run directory, roles.

Every rank runs :func:`run_job` with the job's algorithm (a module of :mod:`mpirl.algos`, chosen by
the caller from ``agent.algorithm``); what is wired here is what every algorithm shares, and no
algorithm is named. Checks that can fail (world size, environment)
run on every rank before the first message, so a bad job exits with code 2 on
all ranks without a collective left waiting.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import pickle
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import mpirl.version
from mpirl.version import __version__
from mpirl import phases
from mpirl.job.contract import Algorithm
from mpirl.comm.backoff import wait_until
from mpirl.config import ConfigError, JobConfig
from mpirl.metrics.heartbeat import Heartbeat
from mpirl.metrics.live import Follower
from mpirl.metrics.progress import RUN_DIR_LINE
from mpirl.metrics.run_file import create_run_file, finish_run_file, link_rank_files, mark_resumed
from mpirl.metrics.tensorboard import LiveEvents, event_files, remove_events
from mpirl.job.checkpoint import Resume, plan_resume
from mpirl.job import launched, memory
from mpirl.job.checks import check_job
from mpirl.job.context import RoleContext
from mpirl.job.preemption import PREEMPTED, Preemption


EXIT_PREEMPTED = 75  # a preempted job: checkpointed, resume it (sysexits' EX_TEMPFAIL)


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
    here = Path(mpirl.version.__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _version(module: str) -> str:
    """A library's version, '' when the job does not use it (its import is not paid for)."""
    if module not in sys.modules:
        return ""
    return str(getattr(sys.modules[module], "__version__", ""))


def provenance(world: MPI.Comm, hosts: list[str]) -> dict:
    import gymnasium
    import mpi4py
    return {
        "package_version": __version__, "git_commit": _git_commit(), "world_size": world.size,
        "hosts": ",".join(sorted(set(hosts))), "rank_hosts": ",".join(hosts),
        "mpi_library": MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip(),
        "mpi4py": mpi4py.__version__, "torch": _version("torch"), "numpy": np.__version__,
        "pettingzoo": _version("pettingzoo"),
        "gymnasium": gymnasium.__version__, "python": platform.python_version(),
        "start_time": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv), "cwd": os.getcwd(), "user": getpass.getuser(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
    }


FAILURE_CLAIM = "failure.claim"  # the first failing rank creates it and writes the failure; later ones leave it


def mark_failed(run_dir: Path, rank: int, role: str, err: BaseException, wall_seconds: float) -> None:
    """``run.h5``: status ``failed`` with the rank, its role and the error's first line, by whichever rank fails
    first (an exclusive create decides, so ranks failing together never write run.h5 at once)."""
    try:
        os.close(os.open(Path(run_dir) / FAILURE_CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return
    first = (str(err).strip().splitlines() or [""])[0][:300]
    reason = f"failed on rank {rank} ({role}): {type(err).__name__}" + (f": {first}" if first else "")
    try:
        finish_run_file(run_dir, "failed", stop_reason=reason, failed_rank=rank, failed_role=role,
                        wall_seconds=wall_seconds)
    except Exception:  # noqa: BLE001 - the failure being reported matters more than this one
        pass


def _peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports kilobytes, macOS bytes)."""
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _agree_on_local_checks(world: MPI.Comm, cfg: JobConfig, est: memory.Estimate, role: str) -> None:
    """Checks whose answer depends on the rank's node; every rank learns the first failure.

    Memory: the ranks of each node (their roles follow from their rank) must fit in its available memory, with
    what they hold already counted as theirs (RssAnon).
    """
    problem = None
    if world.rank == 0 and cfg.agent.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            problem = ("agent.device", f"'cuda' but the learner's node ({MPI.Get_processor_name()}) has no usable "
                       "CUDA device; use 'auto' (CUDA when present) or 'cpu'")
    mine = est.of(role)
    nodes = world.allgather((MPI.Get_processor_name(), mine, memory.available_bytes(), memory.held_bytes()))
    for host in sorted({n[0] for n in nodes}):
        here = [n for n in nodes if n[0] == host]
        need = memory.LIBRARIES + sum(n[1] for n in here)
        avail = [n[2] for n in here if n[2] is not None]
        # The ranks have started: what they hold already is part of the need, not taken from the node.
        free = min(avail) + sum(n[3] for n in here) if avail else None
        try:
            memory.check_fits(cfg, est, need, f"node {host} ({len(here)} ranks)", free)
        except ConfigError as err:
            problem = problem or (err.key, err.message)
    problems = [p for p in world.allgather(problem) if p]
    if problems:
        raise ConfigError(*problems[0])


def _on_rank0(world: MPI.Comm, make):
    """``make()`` on rank 0; every rank gets its value or raises the same ConfigError. The others wait for it
    asleep between tests (rank 0's checks take a second: a blocking broadcast would spin their cores meanwhile)."""
    result = None
    if world.rank == 0:
        try:
            result = make()
        except ConfigError as err:
            result = err
    result = _bcast_asleep(world, result)
    if isinstance(result, ConfigError):
        raise result
    return result


def _bcast_asleep(world: MPI.Comm, obj):
    """``world.bcast(obj)`` from rank 0, waited for with back-off: the size, then the pickled bytes."""
    data = pickle.dumps(obj) if world.rank == 0 else b""
    size = np.array([len(data)], np.int64)
    req = world.Ibcast(size, root=0)
    wait_until(req.Test, first=1e-3, longest=20e-3)
    buf = np.frombuffer(data, np.uint8).copy() if world.rank == 0 else np.empty(int(size[0]), np.uint8)
    req = world.Ibcast(buf, root=0)
    wait_until(req.Test, first=1e-3, longest=20e-3)
    return obj if world.rank == 0 else pickle.loads(buf.tobytes())


def _shared_run_dir(world: MPI.Comm, cfg: JobConfig) -> Path:
    """Rank 0 makes the directory; everyone gets its path or the same error."""
    def make():
        try:
            return str(new_run_dir(cfg))
        except OSError as err:
            raise ConfigError("run.out_dir", f"cannot create a run directory under {cfg.run.out_dir!r}: {err}")
    return Path(_on_rank0(world, make))


def _mark_resumed(run_dir: Path, plan: Resume, cfg: JobConfig) -> None:
    """Rank 0 of a resumed run: run.h5 says so, the line says from where. Without ``log.tensorboard`` the event files
    of its earlier start, which hold rows after the checkpoint and that nothing writes on, go (the HDF5 files hold
    every row), and a line says so."""
    (run_dir / FAILURE_CLAIM).unlink(missing_ok=True)
    mark_resumed(run_dir, plan.restart, checkpoint=plan.checkpoint, job=cfg.flat(), command=" ".join(sys.argv),
                 job_time=plan.job_time)
    print(f"mpirl: resuming {run_dir} from {plan.where()}, job time {plan.job_time:.1f} s; restart {plan.restart}",
          flush=True)
    if not cfg.log.tensorboard and event_files(run_dir):
        remove_events(run_dir)
        print(f"mpirl: log.tensorboard is off: the event files of the run's earlier start are removed (they held rows "
              f"after the checkpoint); `mpirl tensorboard {run_dir}` writes them from the HDF5 files", flush=True)


def run_job(cfg: JobConfig, algo: Algorithm, job_text: str, job_path: str, quiet: bool = False,
            resume: str = "", early: list[int] | None = None) -> int:
    """Run the job on this rank (every rank calls it); ``algo``: the job's algorithm module
    (``mpirl.algos.<name>.algorithm``); ``resume``: a run directory, ``auto`` or ''; ``early``: stop signals this
    rank got while it started (the job then stops at once, the clean way)."""
    world = MPI.COMM_WORLD
    phases.mark("imported roles")
    # Rank 0 checks the job (or finds why not); every rank takes its result: checked once, on one rank.
    checked = _on_rank0(world, lambda: check_job(cfg, algo, world.size, job_path))
    phases.mark("checked")
    _agree_on_local_checks(world, cfg, checked.memory, algo.layout(cfg, world.size).role_of(world.rank))
    phases.mark("node checked")
    plan: Resume | None = _on_rank0(world, lambda: plan_resume(cfg, world.size, resume)) if resume else None
    # A resumed run's clock continues from its checkpoint: metric times stay one axis, without the gap.
    t0 = world.bcast(time.time() - (plan.job_time if plan else 0.0))
    run_dir = Path(plan.run_dir) if plan else _shared_run_dir(world, cfg)
    topo = algo.build_topology(world, cfg)
    if world.rank == 0:
        if launched.command():  # the job passed its checks: the launcher's command, as its first line
            print(f"mpirl: {launched.command()}", flush=True)
        if plan:
            _mark_resumed(run_dir, plan, cfg)
        else:
            if resume:
                print(f"mpirl: --resume {resume}: no unfinished run of '{cfg.run.name}' with a checkpoint "
                      f"under {cfg.run.out_dir}; starting a new one", flush=True)
            create_run_file(run_dir, job_text, cfg.flat(), provenance(world, topo.hosts))
        link_rank_files(run_dir, algo.rank_files(topo))
        print(f"{RUN_DIR_LINE}{run_dir}", flush=True)  # `mpirl launch` reads the run directory from it
        print(f"mpirl: ranks: {algo.role_map(topo)}", flush=True)  # so a report about "rank 3" names a role
    preempt = Preemption(world)
    if early and not preempt.signum:
        preempt.signum = early[0]
    ctx = RoleContext(cfg=cfg, topo=topo, run_dir=run_dir, spaces=checked.spaces, spec=checked.spec,
                      n_params=checked.n_params, t0=t0, preempt=preempt, resume=plan)
    role = algo.ROLES[topo.role]
    # Rank 0 beats from a thread from now on, so `info`, `watch` and `--resume auto` can tell a dead run.
    pids = world.gather((socket.gethostname(), os.getpid()))
    heart = Heartbeat(run_dir, pids) if pids is not None else None  # gathered on rank 0
    # The progress line: `mpirl launch` draws it; without it (srun, a plain mpiexec) a process rank 0 starts does.
    lines = Follower(run_dir, cfg.log.progress_seconds if heart is not None and not quiet
                     and not launched.under_launcher() else 0.0)
    phases.mark("wired")
    try:
        with LiveEvents(run_dir, t0, on=world.rank == 0 and cfg.log.tensorboard):  # its rows as TensorBoard events
            stop_reason = role(ctx)
    except BaseException as err:  # the caller aborts the job; the run must not look alive or finished
        mark_failed(run_dir, world.rank, topo.role_of(world.rank), err, time.time() - t0)
        if isinstance(err, ConfigError):  # found by one rank mid-run: the others cannot know, so abort
            raise RuntimeError(str(err)) from err
        raise
    finally:
        lines.stop()
    phases.mark("role ended")
    # Every rank has closed its files and completed its requests; wait for all, politely.
    barrier = world.Ibarrier()
    wait_until(barrier.Test, first=1e-3, longest=20e-3)
    preempt.close()
    preempted = world.bcast((stop_reason or "").startswith(PREEMPTED) if world.rank == 0 else None)
    peak = world.gather(_peak_rss_bytes())
    topo.free()
    phases.mark("all ended")
    if heart is not None:  # rank 0
        heart.stop()
        status = "preempted" if preempted else "completed"
        finish_run_file(run_dir, status, stop_reason=stop_reason or "",
                        wall_seconds=time.time() - t0, peak_rss_bytes=peak)
        phases.mark("run file finished")
        if not quiet:
            print(algo.summary(run_dir), flush=True)
            phases.mark("summary printed")
        if preempted:
            print(f"mpirl: {stop_reason}; checkpoint written. Continue with: "
                  f"mpirl launch {job_path} --resume {run_dir}", flush=True)
    # Every rank says "try again" (EX_TEMPFAIL), so mpiexec, srun and batch scripts can tell.
    return EXIT_PREEMPTED if preempted else 0
