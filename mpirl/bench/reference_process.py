"""A reference's run in a process session of its own, and everything it started gone when it ends.

The references' runs stop themselves (their wall, then a grace of their own); the timeout here only stops a run
that hangs. Killing the run's process alone is not enough: Ray puts its workers in process groups of their own
(same session), and a worker left behind holds the output pipe open and keeps a core busy for the tests and runs
that come after. So on a timeout, and after every run, each process still in the run's session is killed (read from
``/proc``; where there is none, the run's process group).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile

START_ALLOWANCE = 900.0  # seconds a run may take beyond its wall: start-up on a loaded machine, its own grace


def session_members(sid: int) -> list[int]:
    """The pids in session ``sid`` (Linux ``/proc``; empty where it is absent)."""
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp, session, ...
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:
            pids.append(int(name))
    return pids


def kill_session(sid: int) -> int:
    """SIGKILL every process of session ``sid`` (the session's leader's pid); returns how many were left."""
    members = session_members(sid)
    if not members and not os.path.isdir("/proc"):
        try:
            os.killpg(sid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return 0
    for pid in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(members)


def run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``cmd`` in a session of its own, its output captured: a CompletedProcess once it ended (what it left
    running killed). Past ``timeout`` seconds it and everything it started are killed and a RuntimeError says so.
    Its output goes through files, not pipes: a process it left behind holding a pipe would keep the run from
    ending until the timeout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True, **kwargs)
        late = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            late = True
        finally:
            kill_session(proc.pid)
            proc.wait()
        out.seek(0)
        err.seek(0)
        said, complaint = out.read(), err.read()
    if late:
        raise RuntimeError(f"{' '.join(map(str, cmd[1:]))} did not end within {timeout:.0f} s: stopped, with "
                           f"every process it started; the last it said: {complaint[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, said, complaint)
