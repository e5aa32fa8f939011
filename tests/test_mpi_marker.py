"""The guard that keeps every test that starts ``mpiexec`` marked ``mpi`` (tests/conftest.py) sees a job."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT, _mpiexec_jobs_below, mpi_env, mpiexec


@pytest.mark.mpi
def test_the_guard_sees_a_job_this_process_started(tmp_path):
    assert _mpiexec_jobs_below(os.getpid()) == []
    go = tmp_path / "go"  # the rank waits for it: the job runs until the guard has looked
    wait = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"
    proc = subprocess.Popen([mpiexec(), "-n", "1", sys.executable, "-c", wait, str(go)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=mpi_env(), cwd=ROOT)
    try:
        seen, deadline = [], time.monotonic() + 120
        while not seen and proc.poll() is None and time.monotonic() < deadline:
            seen = _mpiexec_jobs_below(os.getpid())
            time.sleep(0.05)
        assert seen and "-n 1" in seen[0], seen
    finally:
        go.touch()
        try:
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0
    assert _mpiexec_jobs_below(os.getpid()) == []
