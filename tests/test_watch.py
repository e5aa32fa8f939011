"""`mpirl watch`: a live view read from the HDF5 files while the job writes them."""

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from mpirl.metrics.watch import bar, progress

from conftest import ROOT, finish, mpi_env, ranks_of, run_cli, start_mpi, wait_for


def test_progress_toward_each_stop_condition():
    s = {"job": {"run.train_steps": 1000, "run.env_steps": 0, "run.wall_seconds": 600.0,
                 "run.target_return": 195.0, "run.return_window": 20},
         "learner": {"train_steps": 250, "env_steps": 9000, "return_mean20": 97.5}, "elapsed_seconds": 60.0}
    got = {what: round(frac, 3) for what, frac, _ in progress(s)}
    assert got == {"train_steps": 0.25, "wall_seconds": 0.1, "target_return": 0.5}  # env_steps = 0: no condition
    assert bar(0.5, width=10) == "[#####.....]  50.0 %"


def test_watch_refuses_what_is_not_a_run(tmp_path):
    r = run_cli("watch", str(tmp_path))
    assert r.returncode == 2 and "no run.h5 here" in r.stderr


@pytest.mark.mpi
def test_watch_follows_a_running_job_and_ends_with_it(tmp_path):
    w = None
    with start_mpi(4, tmp_path, "run.train_steps=1500", "run.target_return=nan", "run.env_steps=0",
                   "log.interval=0.3", "log.flush_seconds=0.5") as job:
        try:
            wait_for(job, lambda: list(tmp_path.glob("*/run.h5")), "its run.h5")
            run_dir = next(tmp_path.glob("*/run.h5")).parent
            # The buffer held still until watch has drawn two frames: the learner gets no batch, so the job cannot
            # end before watch has seen it running, however slow watch is to start on this machine.
            buffer = ranks_of(job.pid)[1]
            os.kill(buffer, signal.SIGSTOP)
            try:
                w = subprocess.Popen([sys.executable, "-m", "mpirl", "watch", str(run_dir), "--interval", "0.5"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=mpi_env(), cwd=ROOT)
                head, deadline = b"", time.monotonic() + 120
                while head.count(b"mpirl watch  cartpole") < 2 and time.monotonic() < deadline and w.poll() is None:
                    if select.select([w.stdout], [], [], 0.1)[0]:
                        head += os.read(w.stdout.fileno(), 65536)
            finally:
                try:
                    os.kill(buffer, signal.SIGCONT)
                except ProcessLookupError:  # the job is gone: the assertions below say why
                    pass
            out, err = w.communicate(timeout=300)
            code, text = finish(job, 300)
            assert code == 0, text[-3000:]
        finally:
            if w is not None and w.poll() is None:
                w.kill()
                w.wait()
    assert w.returncode == 0, err.decode(errors="replace")
    stdout = (head + out).decode()
    frames = stdout.split("mpirl watch  cartpole")[1:]
    assert len(frames) >= 3, stdout  # it followed the job, frame after frame
    assert "status running" in frames[0] and "status completed" in frames[-1]
    assert "train_steps    [##############################] 100.0 %  1,500 / 1,500 train steps" in frames[-1]
    assert "buffer_1  fill" in frames[-1] and "actor 3" in frames[-1]
