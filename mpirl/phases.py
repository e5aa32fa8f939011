"""Where a job's start-up and shut-down go: named moments of each process, for ``mpirl bench startup``.

Off unless ``MPIRL_PHASES`` names a file: then :func:`mark` appends one line ``<wall time> <pid> <rank> <CPU
seconds of the process so far> <phase>`` to it (one small ``O_APPEND`` write a line, so the launcher and every rank of a local job share the file), and
the process's own start (from ``/proc``, before Python ran a line) is marked once as ``process``. Nothing else
reads it; with the variable unset a mark costs a dictionary lookup.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

_PATH = os.environ.get("MPIRL_PHASES", "")
_started = False


def _process_start() -> float | None:
    """This process's start as wall time (Linux: its start in clock ticks after boot, against the uptime now),
    None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _rank() -> str:
    for key in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if key in os.environ:
            return os.environ[key]
    return "-"


def _write(t: float, phase: str, cpu: float) -> None:
    """One line; a file this process cannot open (a Slurm job's own ``/tmp``, a directory gone) turns the marks off:
    a measurement never ends the job it measures."""
    global _PATH
    try:
        fd = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        _PATH = ""
        return
    try:
        os.write(fd, f"{t:.6f} {os.getpid()} {_rank()} {cpu:.4f} {phase}\n".encode())
    finally:
        os.close(fd)


def mark(phase: str) -> None:
    """Note that this process reached ``phase`` now (a no-op unless ``MPIRL_PHASES`` is set)."""
    global _started
    if not _PATH:
        return
    if not _started:
        _started = True
        start = _process_start()
        if start is not None:
            _write(start, "process", 0.0)
    _write(time.time(), phase, time.process_time())


class Mark(NamedTuple):
    time: float  # wall clock, seconds since the epoch
    pid: int
    rank: str  # the MPI rank, '-' for a process outside the job (the launcher)
    cpu: float  # the process's CPU seconds by then
    phase: str


def read(path: str | os.PathLike) -> list[Mark]:
    """The marks in ``path``, in time order."""
    out = []
    with open(path) as f:
        for line in f:
            t, pid, rank, cpu, phase = line.rstrip("\n").split(" ", 4)
            out.append(Mark(float(t), int(pid), rank, float(cpu), phase))
    return sorted(out)
