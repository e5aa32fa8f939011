"""Shared helpers: MPI jobs run through ``mpiexec`` in a subprocess with a timeout."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# One torch thread in the test processes themselves (before anything imports torch): the workers share two
# cores with each other's MPI jobs, and torch's idle threads spin. An in-process module (test_frame_stream.py)
# took 52 CPU-s with the default two threads against 30 with one, in the same wall time. Tests that mean
# threads set them (torch.set_num_threads); the jobs' ranks get the same default through mpi_env().
os.environ.setdefault("OMP_NUM_THREADS", "1")

from mpirl.bench.run_mpi import RunningJob, train_steps, wait_until  # noqa: E402
from mpirl.launcher import launch_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "jobs"


def _venv_mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    if not beside.exists():
        pytest.fail(f"no mpiexec beside {sys.executable}: install the project with its [mpi] extra "
                    "(see the README's test command)")
    return str(beside)


def mpiexec() -> str:
    """The venv's mpiexec, to start a job from a test marked ``mpi`` (one that is not fails: see
    :func:`_mpi_marker_is_true`)."""
    if _running and not _running[0].get_closest_marker("mpi"):
        pytest.fail(f"{_running[0].nodeid} starts mpiexec: mark it @pytest.mark.mpi")
    return _venv_mpiexec()


@functools.lru_cache(maxsize=1)
def _launch_env() -> tuple[tuple, dict]:
    """mpiexec's flags and what its environment adds (the project's one place for both: mpirl.launcher)."""
    flags, env = launch_env(_venv_mpiexec())
    return tuple(flags), {k: v for k, v in env.items() if os.environ.get(k) != v}


_JOB_TMP: list[str] = []  # made on first use, removed when pytest ends (pytest_unconfigure)


def _job_tmpdir() -> str:
    """The TMPDIR of the jobs this pytest process starts: what a killed job leaves there goes when the tests end."""
    if not _JOB_TMP:
        _JOB_TMP.append(tempfile.mkdtemp(prefix="mpirl-tests-"))
    return _JOB_TMP[0]


def pytest_unconfigure(config):
    for path in _JOB_TMP:
        shutil.rmtree(path, ignore_errors=True)


def mpi_env() -> dict:
    env = {**os.environ, **_launch_env()[1], "TMPDIR": _job_tmpdir()}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@dataclass
class Job:
    proc: subprocess.CompletedProcess
    out_dir: Path

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr

    @property
    def run_dirs(self) -> list[Path]:
        return sorted(p.parent for p in self.out_dir.glob("*/run.h5"))

    @property
    def run_dir(self) -> Path:
        dirs = self.run_dirs
        assert len(dirs) == 1, f"expected one run directory in {self.out_dir}, found {dirs}\n{self.output}"
        return dirs[0]


WHOLE_RUN_CAP = 3600.0  # seconds: a short job that keeps making progress for an hour is still taken for hung


def mpi_command(n: int, out_dir: Path, *sets: str, job: Path = JOBS / "cartpole.toml", args: tuple = ()) -> list:
    """``mpiexec -n n python -m mpirl run job --set run.out_dir=... --set ...`` as an argument list."""
    return [mpiexec(), "-n", str(n), *_launch_env()[0], sys.executable, "-m", "mpirl",
            "run", str(job), "--set", f'run.out_dir="{out_dir}"', *[x for s in sets for x in ("--set", s)], *args]


def ranks_of(mpiexec_pid: int) -> dict[int, int]:
    """World rank -> PID of the ranks a running mpiexec started: its descendants with a rank in their environment
    (Open MPI's prterun forks the ranks itself; MPICH's hydra forks a proxy that does)."""
    parent, ranks = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = dict(kv.split("=", 1) for kv in (entry / "environ").read_bytes().decode(errors="replace").split("\0")
                       if "=" in kv)
            rank = env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK"))  # Open MPI's, MPICH's hydra's
            if rank is not None:
                ranks[int(entry.name)] = int(rank)
        except (OSError, IndexError, ValueError):
            pass
    nearest: dict[int, tuple[int, int]] = {}  # rank -> (hops below mpiexec, PID): a rank's own children share it
    for pid, rank in ranks.items():
        up, hops = parent.get(pid), 0
        while up and up != mpiexec_pid and hops < 8:
            up, hops = parent.get(up), hops + 1
        if up == mpiexec_pid and (hops, pid) < nearest.get(rank, (99, 0)):
            nearest[rank] = (hops, pid)
    return {rank: pid for rank, (_, pid) in nearest.items()}


def processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes (not this one) whose command line contains ``text``, e.g. a job's out_dir."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:  # a zombie's command line is empty: only processes still running match
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def start_mpi(n: int, out_dir: Path, *sets: str, job: Path = JOBS / "cartpole.toml", args: tuple = ()) -> RunningJob:
    """``mpiexec -n n python -m mpirl run job --set ...`` started in the background, for a test that acts on the
    job while it runs: ``with start_mpi(...) as job:``, then :func:`wait_for` what it must have done first
    (:func:`wait_for_train_steps`). Leaving the ``with`` kills whatever of the job is left."""
    return RunningJob(mpi_command(n, out_dir, *sets, job=job, args=args), env=mpi_env(), cwd=ROOT)


def run_mpi_script(n: int, script: Path, *args: str, timeout: float = 300) -> tuple[int, str]:
    """``mpiexec -n n python script args...`` to its end: its exit code and output (a job still running after
    ``timeout`` seconds is killed, every process of it, and fails the test)."""
    cmd = [mpiexec(), "-n", str(n), *_launch_env()[0], sys.executable, str(script), *args]
    with RunningJob(cmd, env=mpi_env(), cwd=ROOT) as job:
        return finish(job, timeout)


def wait_for(job: RunningJob | subprocess.Popen, enough, what: str, timeout: float = 300) -> None:
    """Until ``enough()`` holds while ``job`` (a :class:`RunningJob`, or the Popen of ``mpirl launch``) runs; a job
    that ended first, or made it not within ``timeout`` seconds (a hang, however loaded the machine), fails the
    test with the job's output."""
    proc = job.proc if isinstance(job, RunningJob) else job
    if not wait_until(proc, enough, timeout):
        ended = proc.poll()
        why = f"ended (exit {ended}) before" if ended is not None else f"did not get there within {timeout:.0f} s:"
        output = job.output[-3000:] if isinstance(job, RunningJob) else ""
        pytest.fail(f"the job {why} {what}: {' '.join(map(str, proc.args))}\n{output}")


def wait_for_train_steps(job: RunningJob | subprocess.Popen, out_dir: Path, steps: int, timeout: float = 300) -> None:
    """Until the job's learner (its run under ``out_dir``) has recorded ``steps`` train steps; see :func:`wait_for`."""
    wait_for(job, lambda: train_steps(out_dir) >= steps, f"{steps} train steps", timeout)


def finish(job: RunningJob, timeout: float = 180) -> tuple[int, str]:
    """The job's exit code and output once it ends; one still running after ``timeout`` seconds fails the test."""
    code = job.finish(timeout)
    if code is None:
        job.kill()
        pytest.fail(f"the job did not end within {timeout:.0f} s (hang?): {' '.join(job.cmd)}\n{job.output[-3000:]}")
    return code, job.output


def _progress(out_dir: Path) -> tuple:
    """What a running job has done so far: its learner's train steps once it trains, before that the bytes its
    files hold (the replay filling)."""
    steps = train_steps(out_dir)
    if steps:
        return ("train steps", steps)
    return ("bytes", sum(p.stat().st_size for p in out_dir.glob("*/*.h5") if p.is_file()))


def _watched(cmd: list, out_dir: Path, stall: float, timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` for as long as its job keeps making progress (:func:`_progress`); a job that made none for
    ``stall`` seconds, or ran ``timeout`` in all, is killed and the test fails as hung."""
    start = moved = time.monotonic()
    last, why = None, ""

    def stuck() -> bool:
        nonlocal last, moved, why
        now, seen = time.monotonic(), _progress(out_dir)
        if seen != last:
            last, moved = seen, now
        if now - moved > stall:
            why = f"made no progress for {stall:.0f} s (still at {last[0]} {last[1]})"
        elif now - start > timeout:
            why = f"did not finish within {timeout:.0f} s"
        return bool(why)
    with RunningJob(cmd, env=mpi_env(), cwd=ROOT) as job:
        job.wait_until(stuck, timeout + stall, poll=1.0)
        code = None if why else job.finish(0)
        text = job.output
    if why or code is None:
        pytest.fail(f"MPI job {why or 'did not end'} (hang?): {' '.join(cmd)}\n{text[-6000:]}")
    return subprocess.CompletedProcess(cmd, code, text, "")


def run_mpi(n: int, out_dir: Path, *sets: str, job: Path = JOBS / "cartpole.toml", timeout: float = 180,
            args: tuple = (), stall: float | None = None) -> Job:
    """``mpiexec -n n python -m mpirl run job --set ...`` to its end; a hang is a failed test, never a hung CI. The
    job may take as long as a loaded machine needs, but fails as hung once it made no progress (train steps, or
    before training the bytes its files hold) for ``timeout`` seconds; with ``stall`` (long learning runs), for
    ``stall`` seconds, and ``timeout`` is then the cap on the whole run."""
    cmd = mpi_command(n, out_dir, *sets, job=job, args=args)
    stall, cap = (timeout, WHOLE_RUN_CAP) if stall is None else (stall, timeout)
    return Job(_watched(cmd, out_dir, stall, cap), out_dir)


def in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """``mpirl ARGS`` in this process, for commands that never start MPI (play, export, info): its exit code, stdout
    and stderr, without a Python's start-up and imports for each."""
    from mpirl.cli import main
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out.out, out.err)


IN_PROCESS = ("validate", "info")  # commands that only read and check: run in the test's own process


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``mpirl ARGS`` from the project's directory: its exit code, stdout and stderr. ``validate`` and ``info`` (they
    check a job or read a run, and start nothing) run in this process, whose imports are done: a Python of its own
    costs each about 2 CPU-s of start-up and imports, on a machine the tests' jobs keep busy. The rest run as a
    user runs them."""
    if args and args[0] in IN_PROCESS:
        return _here(*args)
    return subprocess.run([sys.executable, "-m", "mpirl", *args], capture_output=True, text=True,
                          timeout=timeout, env=mpi_env(), cwd=ROOT)


def _here(*args: str) -> subprocess.CompletedProcess:
    """:func:`run_cli` in this process: ``mpirl.cli.main`` in the project's directory, its output captured (argparse's
    own refusals, a SystemExit, give their code)."""
    import contextlib
    import io

    from mpirl.cli import main
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 2
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess([sys.executable, "-m", "mpirl", *args], code, out.getvalue(), err.getvalue())


# ---------------------------------------------------------------- the order
# The modules whose jobs take longest run first: with workers taking whole files (setup.cfg), a long file
# started last keeps one worker busy while the others have nothing left. Within a file the order is unchanged.
# pytest-xdist sorts the files by how many tests each holds unless told not to (--no-loadscope-reorder in setup.cfg):
# without it this order was ignored, and the few-test, long files (the Pendulum learners, the MKL branches, the
# references' bench) ran last, one worker alone for the suite's last minute.
LONGEST_FIRST = ("test_slurm.py", "test_a3c.py", "test_bench.py", "test_bench_references.py", "test_mpi_runs.py",
                 "test_signals.py", "test_impala.py", "test_bench_gradients.py", "test_continuous.py",
                 "test_learners.py", "test_cpu_kernels.py", "test_analysis.py", "test_distql.py", "test_checkpoint.py",
                 "test_qmix_job.py", "test_learning.py", "test_faults.py", "test_types.py", "test_preflight.py",
                 "test_launcher.py", "test_mpich.py", "test_atari_jobs.py", "test_normalization.py",
                 "test_schedules.py", "test_frame_cache.py", "test_minatar.py", "test_recurrent.py",
                 "test_apex_serving.py", "test_play.py", "test_frame_stream.py", "test_watch.py",
                 "test_episode_tally.py")
# (by their summed durations in whole suite runs, pytest --durations=0, 2026-12-03: test_slurm 368 s, mostly waiting on
# Slurm, so it runs beside the others' jobs from the start; test_a3c 193 s ... test_episode_tally 15 s)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its order


# ---------------------------------------------------------------- the mpi marker
LAUNCHERS = {"mpiexec", "mpirun", "prterun"}  # the venv's mpiexec execs prterun (Open MPI 5): same process


def _mpiexec_jobs_below(root: int) -> list[str]:
    """Command lines of the mpiexec jobs (``-n`` given) among the descendants of process ``root``."""
    parent, comm = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                name, rest = (entry / "stat").read_text().rsplit(")", 1)
                parent[int(entry.name)], comm[int(entry.name)] = int(rest.split()[1]), name.split("(", 1)[1]
            except (OSError, IndexError, ValueError):
                pass
    jobs = []
    for pid, name in comm.items():
        if name not in LAUNCHERS:
            continue
        up, seen = parent.get(pid), 0
        while up and up != root and seen < 64:
            up, seen = parent.get(up), seen + 1
        if up == root:
            try:
                argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "-n" in argv or "-np" in argv:
                jobs.append(" ".join(argv)[:200])
    return jobs


class _MpiexecWatch(threading.Thread):
    """Looks for mpiexec jobs this pytest process started (directly, through ``mpirl launch`` or a bench) while
    one test runs; a job takes seconds to start and run, so looking every 0.25 s sees every one (a look reads
    /proc, a few ms: a test shorter than that is never looked at)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done, self.seen = threading.Event(), []

    def run(self) -> None:
        while not self.seen and not self.done.wait(0.25):
            self.seen = _mpiexec_jobs_below(os.getpid())


_running: list = []  # the test running now (its pytest item), for mpiexec() to check its marker


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The test about to run, set before any of its fixtures (a module-scoped fixture that starts a job runs in
    the setup of its first test, before that test's function-scoped fixtures)."""
    _running[:] = [item]


@pytest.fixture(autouse=True)
def _mpi_marker_is_true(request):
    """Every test that starts ``mpiexec`` carries the ``mpi`` marker (``pytest -m "not mpi"`` is then a run without
    MPI): a test without it that starts a job, by any path, fails."""
    if request.node.get_closest_marker("mpi") or not Path("/proc/self/stat").exists():
        yield
        return
    watch = _MpiexecWatch()
    watch.start()
    try:
        yield
    finally:
        watch.done.set()
        watch.join()
    if watch.seen:
        pytest.fail(f"{request.node.nodeid} started mpiexec without the mpi marker "
                    f"(@pytest.mark.mpi or the module's pytestmark): {watch.seen[0]}")


# ---------------------------------------------------------------- output files a command writes
def bad_targets(tmp_path: Path, suffix: str, force: str = "--force") -> list[tuple[Path, tuple[str, ...], str]]:
    """The places an output option (``--out``, ``--video``) must refuse, each as ``(path, extra arguments, what the
    one line says)``: a directory (with ``force`` too: it replaces a file, never a directory), a parent that does
    not exist, a parent that is a file, a place nobody can write (``/proc``, whoever runs the tests), and a file that
    exists without ``force`` (``force=""``: a command that never replaces one). Made under ``tmp_path``; a test
    asserts the tree is the same after each."""
    (tmp_path / f"dir{suffix}").mkdir()
    (tmp_path / "afile").write_bytes(b"")
    (tmp_path / f"there{suffix}").write_bytes(b"mine")
    cases = [(tmp_path / f"dir{suffix}", (), "is a directory"),
             (tmp_path / "missing" / f"x{suffix}", (), "does not exist"),
             (tmp_path / "afile" / f"x{suffix}", (), "is a file, not a directory"),
             (Path("/proc") / f"mpirl-test{suffix}", (), "cannot write in /proc"),
             (tmp_path / f"there{suffix}", (), "exists; pass")]
    if force:
        cases.insert(1, (tmp_path / f"dir{suffix}", (force,), "is a directory"))
    return cases


def tree(path: Path) -> dict[str, bytes]:
    """Every file below ``path`` with its bytes (what a refused command must leave as it was)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
