"""`mpirl launch` stays the job's parent: Ctrl-C or SIGTERM is the clean stop, a second one kills at once,
and the job never outlives its launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import h5py
import pytest

from mpirl.roles import checkpoint

from conftest import JOBS, ROOT, mpi_env, train_steps_so_far

pytestmark = pytest.mark.mpi


def job_processes(marker: str) -> list[int]:
    """PIDs whose command line mentions ``marker`` (the job's out_dir): mpiexec and every rank."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if marker.encode() in f.read() and b"mpirl" in open(f"/proc/{entry.name}/cmdline", "rb").read():
                        pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def gone(marker: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while job_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not job_processes(marker)


class Launched:
    """``python -m mpirl launch`` of the default job, trained until it has a few hundred steps."""

    def __init__(self, out, *extra):
        self.out, self.marker = out, str(out)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mpirl", "launch", str(JOBS / "cartpole.toml"), "--set", f'run.out_dir="{out}"',
             "--set", "run.train_steps=100000", "--set", "run.target_return=nan", "--set", "run.env_steps=0",
             "--set", "log.interval=0.2", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=mpi_env(), cwd=ROOT)

    def wait_for_training(self, steps=300, seconds=120):
        deadline = time.monotonic() + seconds
        while train_steps_so_far(self.out) < steps and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.2)
        assert train_steps_so_far(self.out) >= steps, f"no training within {seconds} s"

    def finish(self, seconds) -> tuple[int, str, float]:
        t = time.monotonic()
        try:
            text, _ = self.proc.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the launcher did not end within {seconds} s")
        return self.proc.returncode, text, time.monotonic() - t

    def kill(self):
        for pid in job_processes(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def run_dir(self):
        return next(self.out.glob("*/run.h5")).parent


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_one_stop_signal_is_a_clean_stop_with_a_checkpoint(tmp_path, signum):
    job = Launched(tmp_path / "runs")
    try:
        job.wait_for_training()
        job.proc.send_signal(signum)
        code, text, took = job.finish(120)
        assert code == 75, text[-3000:]  # EX_TEMPFAIL: checkpointed, resume it
        assert f"{signal.Signals(signum).name}: stopping the job cleanly" in text
        assert gone(job.marker, 10), job_processes(job.marker)
        with h5py.File(job.run_dir / "run.h5", "r") as f:
            assert f.attrs["status"] == "preempted", dict(f.attrs)
            assert f.attrs["stop_reason"].startswith("preempted: SIGUSR1 on rank"), f.attrs["stop_reason"]
            steps = int(f["learner/train/train_steps"][-1])
        assert checkpoint.checkpoints(job.run_dir)[-1].name == f"ckpt-{steps:010d}.pt"
        assert f"--resume {job.run_dir}" in text
    finally:
        job.kill()


def test_a_second_ctrl_c_kills_at_once(tmp_path):
    job = Launched(tmp_path / "runs", "--grace", "300")
    try:
        job.wait_for_training(steps=50)
        job.proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        job.proc.send_signal(signal.SIGINT)
        code, text, took = job.finish(60)
        assert "SIGINT again: killing the job now" in text
        assert code == 128 + signal.SIGKILL and took < 30, (code, took, text[-2000:])
        assert gone(job.marker, 10), job_processes(job.marker)
    finally:
        job.kill()


def test_a_launcher_killed_outright_takes_its_job_along(tmp_path):
    job = Launched(tmp_path / "runs")
    try:
        job.wait_for_training(steps=50)
        job.proc.send_signal(signal.SIGKILL)  # no handler runs: mpiexec's parent-death signal does the work
        job.proc.wait(timeout=10)
        assert gone(job.marker, 30), f"ranks still running after the launcher died: {job_processes(job.marker)}"
    finally:
        job.kill()


def test_grace_must_be_a_finite_positive_number(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mpirl", "launch", str(JOBS / "cartpole.toml"), "--grace", "nan"],
                          capture_output=True, text=True, env=mpi_env(), cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("mpirl: error: --grace: ")
