"""``mpirl`` command line: run, launch, validate, info, watch, bench, play, export, compare, tensorboard.

``run`` is what every MPI rank executes; ``launch`` wraps ``mpiexec`` with the
right flags (and draws the progress line); ``validate`` checks a job without running it; ``info`` summarizes
a run directory from its HDF5 files alone; ``play`` and ``export`` use a run's trained policy in one process
(:mod:`mpirl.trained.commands`); ``compare`` puts seeds together; ``tensorboard`` writes event files for runs that
exist. Bad input exits with code 2 and one line naming the field and the fix.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from mpirl import config, phases
from mpirl.domain import EXIT_BAD_INPUT
from mpirl.domain import bad_input as _fail
from mpirl.launcher import GRACE_SECONDS, find_mpiexec, launch_command, supervise

if TYPE_CHECKING:
    from mpirl.job.contract import Info


def imports_done() -> None:
    """The process has imported what it runs on: keep those objects out of the collector's way (``gc.freeze``)
    and collect from now on (``main`` turned the collector off for the start-up of ``run`` and ``launch``)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _quick_exit(code: int) -> NoReturn:
    """End the process now that its work is done: its files are closed and its requests complete (a rank's, after
    MPI_Finalize here), so the interpreter's teardown of torch and the rest (about 0.3 s a process, and a job's
    ranks share the cores) would change nothing but the time."""
    phases.mark("exit")
    sys.stdout.flush()
    sys.stderr.flush()
    hydra = False
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI
        if MPI.Is_initialized() and not MPI.Is_finalized():
            hydra = "MPICH" in MPI.Get_library_version() or "Intel(R) MPI" in MPI.Get_library_version()
            MPI.Finalize()
    if hydra:
        # MPICH's PMI client tells hydra's proxy it is done from a C exit handler: os._exit skips those, and hydra
        # takes the process for one that died and kills every other rank of the job (seen here in 15 of 15 runs
        # of a QMIX job). libc's exit() runs them, and still skips Python's teardown.
        import ctypes
        ctypes.CDLL(None).exit(code)
    os._exit(code)


def _load(args) -> tuple[config.JobConfig, str]:
    return config.load(args.job, args.set or [])


def _algorithm(cfg: config.JobConfig):
    """The job's algorithm module (``mpirl/algos/<agent.algorithm>/algorithm.py``)."""
    from mpirl import registry
    return registry.algorithm(cfg.agent.algorithm)


def _ranks(args, cfg: config.JobConfig) -> int:
    """``-n`` if given (it must be >= 1), else the world size the job needs."""
    if args.n is None:
        return cfg.world_size
    if args.n < 1:
        raise config.ConfigError("-n", f"the number of ranks must be >= 1, got {args.n}; "
                                 f"omit it for what the job needs ({cfg.world_size})")
    return args.n


def cmd_run(args) -> int:
    # A stop signal from now on is noted for the job (job/preemption.py takes it over once the job runs): one
    # that came while the rank still imported would otherwise end it unhandled, mid-start.
    early: list[int] = []
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, lambda signum, _frame: early.append(signum))
    phases.mark("imported")
    from mpi4py import MPI  # initializes MPI: only the run command needs it
    phases.mark("MPI initialized")
    from mpirl.job.blas_threads import one_blas_thread
    from mpirl.job.waiting import passive_when_oversubscribed
    one_blas_thread()  # before numpy is imported: its matrix products on one thread
    world = MPI.COMM_WORLD
    passive_when_oversubscribed(world)  # before torch is imported: its threads then wait without spinning

    from mpirl.job.wiring import run_job
    try:
        cfg, text = _load(args)
        algo = _algorithm(cfg)
        imports_done()
        return run_job(cfg, algo, text, args.job, quiet=args.quiet, resume=args.resume or "", early=early)
    except config.ConfigError as err:
        from mpirl.job import launched
        if world.rank == 0 and not launched.refuse(str(err)):
            return _fail(str(err))
        return 0 if launched.under_launcher() else EXIT_BAD_INPUT  # launched: the launcher says it, exits 2
    except BaseException:  # any other failure on any rank ends the whole job, never a hang
        import traceback
        print(f"mpirl: rank {world.rank} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        world.Abort(1)
        return 1


def cmd_launch(args) -> int:
    """The job file and the command line are checked here; the rest of the checks are the job's own (rank 0's,
    handed on to every rank: :mod:`mpirl.job.launched`), whose refusal the launcher prints as its own. A world
    whose bare processes alone would not fit this node is checked whole before any rank starts."""
    import tempfile

    from mpirl.job import launched, memory
    try:
        cfg, _ = _load(args)
        n = _ranks(args, cfg)
        if not (args.grace > 0 and math.isfinite(args.grace)):
            raise config.ConfigError("--grace", f"seconds to wait for a clean stop must be a finite number > 0, "
                                     f"got {args.grace}")
        avail = memory.available_bytes()
        if avail is not None and n * memory.PROCESS + memory.LIBRARIES > avail:  # starting them could harm the node
            from mpirl.job.checks import check_local_job
            check_local_job(cfg, _algorithm(cfg), n, args.job)
        if args.resume:  # a run that cannot be resumed is refused here, before any rank starts
            from mpirl.job.checkpoint import plan_resume
            plan_resume(cfg, n, args.resume)
        cmd, env = launch_command(find_mpiexec(args.mpiexec), n, args.job, args.set or [], args.mpiexec_args,
                                  args.resume or "")
    except config.ConfigError as err:
        return _fail(str(err))
    phases.mark("launcher checked")
    imports_done()
    with tempfile.TemporaryDirectory(prefix="mpirl-launch-") as where:
        refusal = Path(where) / "refusal"
        env.update(launched.environment(refusal, cmd))
        # The launcher stays mpiexec's parent: Ctrl-C or a SIGTERM becomes the job's clean stop (a checkpoint,
        # exit 75), a second one kills it, and the job never outlives the launcher (see mpirl/launcher.py). It
        # passes the job's output on, with the progress line between (mpirl/metrics/live.py).
        live = None
        if cfg.log.progress_seconds > 0:
            from mpirl.metrics.live import Live
            live = Live(cfg.log.progress_seconds, lambda run_dir: _run_info(run_dir).summarize(run_dir))
        code = supervise(cmd, env, args.grace, live=live)
        why = launched.refusal(refusal)
    return _fail(why) if why else code


def cmd_validate(args) -> int:
    try:
        cfg, _ = _load(args)
        from mpirl.job.checks import check_job
        n = _ranks(args, cfg)
        algo = _algorithm(cfg)
        checked = check_job(cfg, algo, n, args.job)
        est = checked.memory
        plan = None
        if args.resume:
            from mpirl.job.checkpoint import plan_resume
            plan = plan_resume(cfg, n, args.resume)
    except config.ConfigError as err:
        return _fail(str(err))
    print(f"ok: {args.job} on {n} ranks: {algo.describe(cfg, n, checked)}")
    from mpirl.job import memory
    avail = memory.available_bytes()
    print(f"ok: memory about {est.total() / 2**30:.1f} GiB for all ranks on one node ({est.text()}, "
          f"{memory.LIBRARIES / 2**20:.0f} MiB of shared libraries); "
          f"this node has {'?' if avail is None else f'{avail / 2**30:.1f}'} GiB available")
    if plan:
        print(f"ok: resumes {plan.run_dir} from {plan.where()}")
    elif args.resume:
        print(f"ok: --resume {args.resume}: no unfinished run with a checkpoint; a new run starts")
    return 0


def _run_info(run_dir: Path) -> Info:
    """The info module of the run's algorithm (``agent.algorithm`` in run.h5's job; a run without it ran the
    setting's default, as a job without it does)."""
    from mpirl import registry
    from mpirl.metrics.run_file import read_algorithm
    name = read_algorithm(run_dir)
    return registry.info(name if name in config.ALGORITHMS else config.AgentConfig().algorithm)


def _summary(run_dir: Path) -> str:
    """The run's algorithm's summary."""
    mod = _run_info(run_dir)
    return mod.format_summary(mod.summarize(run_dir))


def cmd_info(args) -> int:
    from mpirl.metrics.run_file import newest_run
    try:
        path = newest_run(args.run_dir)
    except config.ConfigError as err:
        return _fail(str(err))
    if path != Path(args.run_dir):
        print(f"mpirl: newest run in {args.run_dir}: {path}")
    print(_summary(path))
    return 0


def cmd_watch(args) -> int:
    from mpirl.metrics.watch import watch
    path = Path(args.run_dir)
    if not (path / "run.h5").exists():
        return _fail(f"{path}: no run.h5 here; pass a run directory such as runs/cartpole-20260101-120000")
    if not (args.interval > 0 and math.isfinite(args.interval)):
        return _fail(f"--interval: seconds between frames must be > 0, got {args.interval}")
    info = _run_info(path)
    try:
        if args.line:  # the progress line (mpirl/metrics/progress.py); rank 0 runs this when no launcher draws it
            from mpirl.metrics.live import follow
            return follow(path, info.summarize, args.interval, once=args.once)
        return watch(path, info.summarize, info.frame, args.interval, once=args.once)
    except KeyboardInterrupt:
        return 0


def cmd_compare(args) -> int:
    """Seeds together (mpirl/metrics/compare.py): runs grouped by their job but the seed and what a resumed job may
    change, one PNG of the median curves, the table of final values; a run skipped is a note on stderr."""
    from mpirl.job.checkpoint import MAY_CHANGE, MAY_CHANGE_SECTIONS
    from mpirl.metrics.compare import SEED_KEYS, compare
    try:
        done = compare(args.run_dirs, y=args.y, x=args.x, out=Path(args.out), force=args.force, seed=args.seed,
                       ignore=(*SEED_KEYS, *MAY_CHANGE), ignore_sections=MAY_CHANGE_SECTIONS)
    except config.ConfigError as err:
        return _fail(str(err))
    for note in done.notes:
        print(f"mpirl: note: {note}", file=sys.stderr)
    print(done.table)
    print(f"mpirl: wrote {done.out}")
    return 0


def compare_parser(sub) -> None:
    """``mpirl compare``'s arguments (out of :func:`parser`, which stays under a screen)."""
    sp = sub.add_parser("compare", help="seeds together: runs grouped by their job but the seed, median curves "
                                        "with interquartile bands (one PNG) and a table of final values")
    sp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                    help="run directories, or directories holding runs (every run.h5 below)")
    sp.add_argument("--y", default="return", metavar="return|TABLE.COLUMN",
                    help="what to compare: the return (default: the mean of the last run.return_window episodes), "
                         "or a column such as learner.loss or buffer.episodes.length")
    sp.add_argument("--x", default="env_steps", choices=["env_steps", "train_steps", "time"],
                    help="against env steps (default), train steps or wall time")
    sp.add_argument("--out", default="compare.png", metavar="FILE.png",
                    help="the PNG to write (default compare.png here; never overwritten without --force)")
    sp.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    sp.add_argument("--seed", type=int, default=0, help="seed of the IQM's bootstrap (default 0)")
    sp.set_defaults(func=cmd_compare)


def cmd_tensorboard(args) -> int:
    """Event files for runs that exist (mpirl/metrics/tensorboard.py): every run checked before any is written."""
    from mpirl.metrics import tensorboard
    try:
        runs = tensorboard.runs_of(args.run_dirs, force=args.force)
    except config.ConfigError as err:
        return _fail(str(err))
    for run_dir in runs:
        print(f"mpirl: {tensorboard.export(run_dir)}")
    print(f"mpirl: view them with: tensorboard --logdir {os.path.commonpath([str(r) for r in runs])}")
    return 0


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
    sp.add_argument("--grace", type=float, default=GRACE_SECONDS, metavar="SECONDS",
                    help="after Ctrl-C, SIGTERM or SIGHUP, how long to wait for the clean stop (checkpoint, exit 75) "
                         f"before killing the job (default {GRACE_SECONDS:g}); a second Ctrl-C kills at once")
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
    sp.add_argument("--line", action="store_true",
                    help="the progress line instead of the frame (`mpirl launch` prints it every log.progress_seconds)")
    sp.set_defaults(func=cmd_watch)

    from mpirl.bench.command import add_parser
    add_parser(sub)  # bench

    from mpirl.trained.commands import add_parsers
    add_parsers(sub)  # play, export

    compare_parser(sub)

    sp = sub.add_parser("tensorboard", help="TensorBoard event files (RUN_DIR/tensorboard/) for runs that exist, "
                                            "from every rank's HDF5 file")
    sp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories, or directories of runs")
    sp.add_argument("--force", action="store_true",
                    help="replace the event files a run has (the job's own, or an earlier export)")
    sp.set_defaults(func=cmd_tensorboard)
    return p


NO_MPI = ("launch", "validate", "info", "watch", "play", "export", "compare",
          "tensorboard")  # commands that never talk MPI themselves
QUICK_EXIT = ("run", "launch")  # commands whose process ends as soon as its work is done and said


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv`` None: this process's own, as the ``mpirl`` program; a list: called in-process,
    which changes nothing of the process it runs in)."""
    args = parser().parse_args(argv)
    program = argv is None
    if program and args.command in QUICK_EXIT:
        gc.disable()  # until the imports are done (imports_done): the collector walks torch's objects for nothing
    if program and args.command in NO_MPI:
        # Modules the checks import import mpi4py.MPI, which initializes MPI on import: a singleton MPI's start-up
        # (about a second here) that these commands never use.
        import mpi4py
        mpi4py.rc.initialize = mpi4py.rc.finalize = False
    try:
        code = args.func(args)
        if program and args.command in QUICK_EXIT:
            _quick_exit(code)
        return code
    except BrokenPipeError:  # `mpirl info ... | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:  # Ctrl-C before a job started (launch's checks, validate, info): no traceback
        print("mpirl: interrupted", file=sys.stderr, flush=True)
        return 128 + 2
    finally:
        phases.mark("exit")


if __name__ == "__main__":
    sys.exit(main())
