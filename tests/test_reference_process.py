"""A reference's run leaves nothing behind: what it started in process groups of its own (as Ray starts its
workers) is killed when it ends, and a run past its timeout is stopped with all of it."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from mpirl.bench import reference_process

# A driver that starts a worker in a process group of its own (as Ray's raylet starts its workers), says the
# worker's pid, then ends (or hangs): the worker would outlive it.
DRIVER = textwrap.dedent("""
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], process_group=0)
    open(sys.argv[2], "w").write(str(worker.pid))
    print("the driver is done", file=sys.stderr, flush=True)
    if sys.argv[1] == "hang":
        time.sleep(600)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


def gone_soon(pid: int, deadline: float = 60.0) -> bool:
    end = time.monotonic() + deadline
    while alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads processes from /proc")


def test_a_finished_run_leaves_no_process_behind(tmp_path):
    proc = reference_process.run([sys.executable, "-c", DRIVER, "end", str(tmp_path / "pid")], timeout=300)
    worker = int((tmp_path / "pid").read_text())
    assert proc.returncode == 0 and "the driver is done" in proc.stderr
    assert gone_soon(worker), f"the worker {worker} outlived its run"


def test_a_run_past_its_timeout_is_stopped_with_everything_it_started(tmp_path):
    with pytest.raises(RuntimeError, match=r"did not end within 5 s: stopped, with every process it started"
                                           r"(.|\n)*the driver is done"):
        reference_process.run([sys.executable, "-c", DRIVER, "hang", str(tmp_path / "pid")], timeout=5)
    worker = int((tmp_path / "pid").read_text())
    assert gone_soon(worker), f"the worker {worker} outlived its stopped run"


def test_session_members_finds_this_process_in_its_own_session():
    assert os.getpid() in reference_process.session_members(os.getsid(0))
