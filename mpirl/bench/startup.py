"""Start-up and shut-down: what a job costs beyond its own work, phase by phase, against the floor.

    mpirl bench startup [--reps 5]

*Ours*: ``mpirl launch`` of the a3c CartPole job (5 ranks: a parameter server and 4 workers) and of the default
Ape-X job (4 ranks), timed as a user sees it: the launcher's process wall, from its start to its exit, minus the
job's own wall (``run.h5``'s ``wall_seconds``: from the moment the ranks agree the job starts to the run file's
end). Every process marks its phases (:mod:`mpirl.phases`, ``MPIRL_PHASES``) and the breakdown says where the
rest goes: the launcher's reading of the job, ``mpiexec`` and its ranks' start, MPI's initialization, the ranks'
imports, rank 0's checks (handed on to the others), the wiring; then from the stop: the ranks' ends, the run
file and the summary, MPI's and the processes' ends.

*The floor*: the same ``mpiexec`` (same flags and environment) starting as many ranks that import what the job's
ranks import before its clock starts, finalize MPI and leave as ours do (``os._exit``): for the a3c job
``mpi4py.MPI`` and ``torch`` on every rank (each trains or plays with a network from its first step); for the
Ape-X job ``mpi4py.MPI``, and ``torch`` on rank 0 alone (it counts the network for the checks and learns; on
CartPole's vector observations the buffer never imports torch and the actors act with numpy's copy of the network,
:mod:`mpirl.agents.acting`). What no such job can go below on this
machine. The ratio is the floor's seconds over ours (1: nothing of ours left). The target is the issue's: the
a3c job's process wall within 3 s of its job wall.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py

from mpirl import phases
from mpirl.bench.report import MIN_REPS, Row
from mpirl.launcher import find_mpiexec, launch_env, own_session_dir

ROOT = Path(__file__).resolve().parents[2]
# job, ranks, what every rank and what rank 0 alone imports before the job's clock starts, the bound (seconds)
JOBS = [("a3c_cartpole.toml", 5, "torch", "", 3.0), ("cartpole.toml", 4, "", "torch", None)]
TIMEOUT = 600.0

# The breakdown: (label, (whose, phase) at its start, (whose, phase) at its end); "launcher" is the launch
# process, "first"/"last" the earliest/latest rank to get there, "rank 0" the first rank.
STEPS = [
    ("launcher: Python, reading the job", ("launcher", "process"), ("launcher", "mpiexec started")),
    ("mpiexec starts the ranks", ("launcher", "mpiexec started"), ("last", "process")),
    ("ranks: Python, mpirl's command line", ("last", "process"), ("last", "imported")),
    ("ranks: MPI_Init", ("last", "imported"), ("last", "MPI initialized")),
    ("ranks: imports", ("last", "MPI initialized"), ("last", "imported roles")),
    ("ranks: rank 0's checks, handed on", ("last", "imported roles"), ("last", "checked")),
    ("ranks: node checks, run directory, communicators", ("last", "checked"), ("last", "wired")),
    ("-- the job (its wall includes what follows up to the run file) --", None, None),
    ("ranks: wired -> the first rank's games reset", ("last", "wired"), ("first", "games started")),
    ("stop: the last rank's role ends", ("first", "role ended"), ("last", "role ended")),
    ("stop: barrier, notices, communicators freed", ("last", "role ended"), ("last", "all ended")),
    ("rank 0: run file finished, summary printed", ("rank 0", "run file finished"), ("rank 0", "exit")),
    ("ranks' MPI_Finalize and exits, mpiexec's end", ("last", "exit"), ("launcher", "mpiexec ended")),
    ("launcher: its own end", ("launcher", "mpiexec ended"), ("launcher", "end")),
]


def _at(marks: list[phases.Mark], whose: str, phase: str, launcher_pid: int, end: float) -> float:
    if whose == "launcher":
        if phase == "end":
            return end
        times = [m.time for m in marks if m.pid == launcher_pid and m.phase == phase]
    elif whose == "rank 0":
        times = [m.time for m in marks if m.rank == "0" and m.phase == phase]
    else:
        times = [m.time for m in marks if m.pid != launcher_pid and m.phase == phase]
    if not times:
        return float("nan")
    return max(times) if whose == "last" else min(times)


def breakdown(marks: list[phases.Mark], launcher_pid: int, end: float) -> dict[str, float]:
    """Seconds of each step of :data:`STEPS` in one launch."""
    out = {}
    for label, start, stop in STEPS:
        if start is not None and stop is not None:
            out[label] = _at(marks, *stop, launcher_pid, end) - _at(marks, *start, launcher_pid, end)
    return out


def launch_once(job: str, out: Path) -> tuple[float, float, dict[str, float]]:
    """One ``mpirl launch``: its process wall, the job's wall, the breakdown."""
    marks_file = out / f"phases-{time.monotonic_ns()}.txt"
    env = {**os.environ, "MPIRL_PHASES": str(marks_file)}
    cmd = [sys.executable, "-m", "mpirl", "launch", str(ROOT / "jobs" / job), "--set", f'run.out_dir="{out}"',
           "--set", 'run.name="startup"']
    before = set(out.glob("startup-*"))
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    end = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"startup bench job failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    (run_dir,) = set(out.glob("startup-*")) - before
    with h5py.File(run_dir / "run.h5", "r") as f:
        job_wall = float(f.attrs["wall_seconds"])
    marks = phases.read(marks_file)
    launcher = next(m.pid for m in marks if m.phase == "mpiexec started")
    return end - t0, job_wall, breakdown(marks, launcher, end)


def floor_once(n: int, imports: str, rank0: str = "") -> float:
    """``mpiexec`` of ``n`` ranks that import ``mpi4py.MPI`` and ``imports`` (rank 0 also ``rank0``), finalize
    MPI and leave: its process wall."""
    mpiexec = find_mpiexec()
    flags, env = launch_env(mpiexec)
    lines = ["import os", "from mpi4py import MPI", *([f"import {imports}"] if imports else []),
             *([f"if MPI.COMM_WORLD.rank == 0: import {rank0}"] if rank0 else []), "MPI.Finalize()", "os._exit(0)"]
    code = "\n".join(lines)
    cmd = [mpiexec, "-n", str(n), *flags, sys.executable, "-c", code]
    with own_session_dir(env) as job_env:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=job_env, timeout=TIMEOUT)
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"startup bench floor failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return seconds


def run(reps: int = MIN_REPS, jobs=JOBS) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="mpirl-startup-") as tmp:
        for job, n, imports, rank0, bound in jobs:
            what = "MPI and " + imports if imports else "MPI" + (f", rank 0 {rank0}" if rank0 else "")
            r = Row(f"start-up and shut-down, {job} ({n} ranks): process wall - job wall", "s", "ours",
                    f"floor: mpiexec of {n} ranks importing {what}", higher_is_better=False, at_most=bound,
                    note="ours from the launcher's start to its exit; the floor's from mpiexec's start to its exit")
            steps: dict[str, list[float]] = {}
            for _ in range(reps):  # alternate, so drifts of the machine hit both
                wall, job_wall, parts = launch_once(job, Path(tmp))
                r.values.setdefault("ours", []).append(wall - job_wall)
                r.values.setdefault("job wall (not counted)", []).append(job_wall)
                r.values.setdefault(r.reference, []).append(floor_once(n, imports, rank0))
                for k, v in parts.items():
                    steps.setdefault(k, []).append(v)
            print(f"  {job}: where the process wall goes (medians of {reps} launches, seconds)", flush=True)
            for label, start, _ in STEPS:
                if start is None:
                    print(f"    {label}")
                else:
                    print(f"    {label:58s} {statistics.median(steps[label]):7.3f}")
            rows.append(r)
    return rows
