"""Start a benchmark's MPI half (``mpirl.bench.ranks``, ``mpirl.bench.allreduce_job``) or a job under the venv's
mpiexec and read what it wrote."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from mpirl.launcher import find_mpiexec, kill_job, launch_command, launch_env, own_session_dir

EXIT_STOPPED = 75  # a job stopped by SIGUSR1: checkpointed, every rank ended cleanly (mpirl.job.wiring)


def mpiexec_json(what: str, opts: dict, timeout: float, n: int = 2, module: str = "mpirl.bench.ranks") -> dict:
    """``mpiexec -n n python -m module what OUT.json OPTS`` with a timeout; its result (what rank 0 wrote to
    OUT.json), or RuntimeError."""
    mpiexec = find_mpiexec()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        flags, env = launch_env(mpiexec)
        cmd = [mpiexec, "-n", str(n), *flags, sys.executable, "-m", module, what, str(out), json.dumps(opts)]
        try:
            with own_session_dir(env) as job_env:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=job_env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"benchmark {what!r} did not finish within {timeout:.0f} s: {' '.join(cmd)}") from None
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"benchmark {what!r} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def run_job(n: int, job: str, sets: list[str], out: Path, name: str, timeout: float, what: str) -> Path:
    """``mpirl run`` of ``job`` on ``n`` ranks under the venv's mpiexec, its runs under ``out`` named ``name``;
    the run directory it made, or RuntimeError naming ``what`` bench it was for."""
    cmd, env = launch_command(find_mpiexec(), n, str(job), [*sets, f'run.out_dir="{out}"', f'run.name="{name}"'], [])
    cmd.append("--quiet")
    try:
        with own_session_dir(env) as job_env:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=job_env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} bench job did not finish in {timeout:.0f} s: {' '.join(cmd)}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{what} bench job failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return sorted(Path(out).glob(f"{name}-*/run.h5"), key=lambda p: p.stat().st_mtime)[-1].parent


def spanned(rows: dict, seconds: float) -> bool:
    """Every ``(times, values)`` of ``rows`` (per actor, per sender) holds two rows or more over ``seconds``."""
    return bool(rows) and all(len(ts) >= 2 and ts[-1] > ts[0] and ts[-1] - ts[0] >= seconds
                              for ts, _ in rows.values())


def _new_run(out: Path, name: str, before: set) -> Path | None:
    """The run directory named ``name`` that the job made (not one of ``before``, earlier runs of that name)."""
    runs = sorted((p for p in Path(out).glob(f"{name}-*/run.h5") if p.parent not in before),
                  key=lambda p: p.stat().st_mtime)
    return runs[-1].parent if runs else None


def _holds(enough: Callable[[], object]) -> bool:
    """``enough()`` on files a running job is writing: a half-written file is "not yet"."""
    try:
        return bool(enough())
    except (OSError, KeyError, ValueError, IndexError):
        return False


def train_steps(out_dir: Path) -> int:
    """The learner's last recorded train steps of the run under ``out_dir`` (0 before its first row)."""
    import h5py
    for f in Path(out_dir).glob("*/learner.h5"):
        try:
            with h5py.File(f, "r", locking=False) as h:
                steps = h["train/train_steps"][()]
                return int(steps[-1]) if len(steps) else 0
        except (OSError, KeyError):
            return 0
    return 0


def wait_until(proc: subprocess.Popen, enough: Callable[[], object], timeout: float, poll: float = 0.2) -> bool:
    """True as soon as ``enough()`` holds while ``proc`` (a job) runs, ``enough`` reading the files the job writes
    (opened with ``locking=False``; a half-written one is "not yet"); False if the job ended first or ``timeout``
    seconds passed. Waits for the event, however long this machine takes up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if _holds(enough):
            return True
        if time.monotonic() > deadline:
            return False
        try:
            proc.wait(timeout=poll)
        except subprocess.TimeoutExpired:
            pass
    return False


class RunningJob:
    """An ``mpiexec`` job started in a session of its own, its output going to a file (nobody reads a pipe while
    it runs): what waits for the rows it writes, and ends it. Used as a context manager, leaving it kills
    whatever of the job is left and removes its MPI session directory (``own_session_dir``), so nothing of a
    job outlives its caller: a hung job is an error, never a hang."""

    def __init__(self, cmd: list[str], env: dict | None = None, cwd: Path | str | None = None) -> None:
        self.cmd = cmd
        self._held = ExitStack()
        self._log = self._held.enter_context(tempfile.TemporaryFile("w+"))
        job_env = self._held.enter_context(own_session_dir(env))
        try:
            self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, text=True, env=job_env,
                                         cwd=cwd, start_new_session=True)
        except BaseException:
            self._held.close()
            raise

    @property
    def pid(self) -> int:
        """``mpiexec``'s PID (its ranks are its children)."""
        return self.proc.pid

    def wait_until(self, enough: Callable[[], object], timeout: float, poll: float = 0.2) -> bool:
        """:func:`wait_until` on this job."""
        return wait_until(self.proc, enough, timeout, poll)

    def until_trained(self, out_dir: Path, steps: int, timeout: float) -> bool:
        """:meth:`wait_until` the learner of the run under ``out_dir`` has recorded ``steps`` train steps."""
        return self.wait_until(lambda: train_steps(out_dir) >= steps, timeout)

    def finish(self, timeout: float) -> int | None:
        """The job's exit code once it ends, or None if it is still running after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    @property
    def output(self) -> str:
        """Everything the job wrote so far (stdout and stderr)."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def kill(self) -> None:
        """SIGKILL to every process of the job; returns once none is left."""
        if self.proc.poll() is None:
            kill_job(self.proc)

    def __enter__(self) -> RunningJob:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.kill()
        finally:
            self._held.close()  # the output file and the session directory


def run_job_until(n: int, job: str, sets: list[str], out: Path, name: str, enough: Callable[[Path], bool],
                  timeout: float, what: str, poll: float = 0.25) -> Path:
    """``mpirl run`` of ``job`` on ``n`` ranks until ``enough(run_dir)`` holds, then its clean stop.

    For measurements that need so many rows, not so many seconds: the job runs as long as this machine takes
    to write them (``enough`` reads the run's HDF5 files while the job writes them, so it must open them with
    ``locking=False``), then gets SIGUSR1 (``mpiexec`` forwards it to every rank: the stop every rank takes at
    the end of a job, exit 75). A job that ends by itself (one of its own stop conditions, e.g. a
    ``run.wall_seconds`` backstop) counts if ``enough`` holds then. ``timeout``: seconds until the job is
    taken for hung and killed. Returns the run directory, or RuntimeError naming ``what`` bench it was for.
    """
    cmd, env = launch_command(find_mpiexec(), n, str(job), [*sets, f'run.out_dir="{out}"', f'run.name="{name}"'], [])
    cmd.append("--quiet")
    before = {p.parent for p in Path(out).glob(f"{name}-*/run.h5")}
    deadline = time.monotonic() + timeout

    def ready() -> bool:
        run_dir = _new_run(out, name, before)
        return run_dir is not None and enough(run_dir)
    with RunningJob(cmd, env) as running:
        if running.wait_until(ready, timeout, poll):
            running.proc.send_signal(signal.SIGUSR1)
        code = running.finish(max(0.0, deadline - time.monotonic()))
        text = running.output
    if code is None:
        raise RuntimeError(f"{what} bench job did not give its rows and stop within {timeout:.0f} s: "
                           f"{' '.join(cmd)}\n{text[-2000:]}")
    if code not in (0, EXIT_STOPPED):
        raise RuntimeError(f"{what} bench job failed (exit {code}): {text[-2000:]}")
    run_dir = _new_run(out, name, before)
    if run_dir is None:
        raise RuntimeError(f"{what} bench job wrote no run under {out}: {text[-2000:]}")
    return run_dir
