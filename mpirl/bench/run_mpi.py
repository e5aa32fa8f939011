"""Start a two-rank benchmark (``mpirl.bench.ranks``) under the venv's mpiexec and read its JSON."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from mpirl.launcher import find_mpiexec, launch_command, launch_env

EXIT_STOPPED = 75  # a job stopped by SIGUSR1: checkpointed, every rank ended cleanly (mpirl.roles.job)


def mpiexec_json(what: str, opts: dict, timeout: float) -> dict:
    """``mpiexec -n 2 python -m mpirl.bench.ranks what`` with a timeout; its result, or RuntimeError."""
    mpiexec = find_mpiexec()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        flags, env = launch_env(mpiexec)
        cmd = [mpiexec, "-n", "2", *flags, sys.executable, "-m", "mpirl.bench.ranks", what, str(out), json.dumps(opts)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
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
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
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


def _holds(enough: Callable[[Path], bool], run_dir: Path) -> bool:
    """``enough(run_dir)`` on files a running job is writing: a half-written file is "not yet"."""
    try:
        return bool(enough(run_dir))
    except (OSError, KeyError, ValueError, IndexError):
        return False


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
    from mpirl.launcher import _kill_job
    cmd, env = launch_command(find_mpiexec(), n, str(job), [*sets, f'run.out_dir="{out}"', f'run.name="{name}"'], [])
    cmd.append("--quiet")
    before = {p.parent for p in Path(out).glob(f"{name}-*/run.h5")}
    deadline = time.monotonic() + timeout
    hung = False
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: nobody reads while the job runs
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        try:
            run_dir, stopped = None, False
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    hung = True
                    break
                run_dir = run_dir or _new_run(out, name, before)
                if not stopped and run_dir is not None and _holds(enough, run_dir):
                    proc.send_signal(signal.SIGUSR1)
                    stopped = True
                try:
                    proc.wait(timeout=poll)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            if proc.poll() is None:  # hung, or this raised: nothing of the job may outlive the bench
                _kill_job(proc)
        log.seek(0)
        text = log.read()
    if hung:
        raise RuntimeError(f"{what} bench job did not give its rows and stop within {timeout:.0f} s: "
                           f"{' '.join(cmd)}\n{text[-2000:]}")
    if proc.returncode not in (0, EXIT_STOPPED):
        raise RuntimeError(f"{what} bench job failed (exit {proc.returncode}): {text[-2000:]}")
    run_dir = _new_run(out, name, before)
    if run_dir is None:
        raise RuntimeError(f"{what} bench job wrote no run under {out}: {text[-2000:]}")
    return run_dir
