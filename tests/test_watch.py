"""`mpirl watch`: a live view read from the HDF5 files while the job writes them."""

import subprocess
import sys
import time

import pytest

from mpirl.metrics.watch import bar, progress

from conftest import ROOT, mpi_command, mpi_env, run_cli


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
    cmd = mpi_command(4, tmp_path, "run.train_steps=1500", "run.target_return=nan", "run.env_steps=0",
                      "log.interval=0.3", "log.flush_seconds=0.5")
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=mpi_env(), cwd=ROOT)
    try:
        deadline = time.monotonic() + 90
        while not list(tmp_path.glob("*/run.h5")) and time.monotonic() < deadline:
            time.sleep(0.1)
        run_dir = next(tmp_path.glob("*/run.h5")).parent
        w = subprocess.run([sys.executable, "-m", "mpirl", "watch", str(run_dir), "--interval", "0.5"],
                           capture_output=True, text=True, timeout=150, env=mpi_env(), cwd=ROOT)
        assert job.wait(timeout=60) == 0
    finally:
        if job.poll() is None:
            job.kill()
    assert w.returncode == 0, w.stderr
    frames = w.stdout.split("mpirl watch  cartpole")[1:]
    assert len(frames) >= 3, w.stdout  # it followed the job, frame after frame
    assert "status running" in frames[0] and "status completed" in frames[-1]
    assert "train_steps    [##############################] 100.0 %  1,500 / 1,500 train steps" in frames[-1]
    assert "buffer_1  fill" in frames[-1] and "actor 3" in frames[-1]
