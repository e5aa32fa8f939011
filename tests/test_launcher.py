"""`mpirl launch` stays the job's parent: Ctrl-C, SIGTERM or a hang-up is the clean stop (a checkpoint, exit 75,
status preempted), a second Ctrl-C kills at once, a stop that takes longer than ``--grace`` is cut short, and
no process of the job outlives the launcher.

A terminal sends Ctrl-C (and a hang-up) to its whole foreground process group, so those tests start the
launcher in a process group of its own and signal the group; ``kill``, ``timeout`` and workflow tools signal
the launcher alone. Every test has a deadline and kills whatever of its job is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import h5py
import pytest

from mpirl.roles import checkpoint

from conftest import JOBS, ROOT, mpi_env, processes_mentioning, train_steps_so_far

pytestmark = pytest.mark.mpi


class Launched:
    """A launcher (``python -m mpirl launch`` unless ``cmd`` is given) in a process group of its own."""

    def __init__(self, out, *extra, cmd=None):
        self.out, self.marker = out, str(out)
        self.proc = subprocess.Popen(
            cmd or [sys.executable, "-m", "mpirl", "launch", str(JOBS / "cartpole.toml"),
                    "--set", f'run.out_dir="{out}"', "--set", "run.train_steps=100000",
                    "--set", "run.target_return=nan", "--set", "run.env_steps=0", "--set", "log.interval=0.2", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=mpi_env(), cwd=ROOT, process_group=0)
        self.signalled = 0.0

    def wait_for_training(self, steps=300, seconds=120):
        deadline = time.monotonic() + seconds
        while train_steps_so_far(self.out) < steps and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.2)
        assert train_steps_so_far(self.out) >= steps, f"no training within {seconds} s"

    def wait_for(self, path, seconds=30):
        deadline = time.monotonic() + seconds
        while not path.exists() and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        assert path.exists(), f"{path} did not appear within {seconds} s"

    def signal(self, signum, terminal: bool):
        """As a terminal sends it (the launcher's whole process group) or as ``kill`` does (the launcher)."""
        self.signalled = self.signalled or time.monotonic()
        if terminal:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)

    def finish(self, seconds) -> tuple[int, str, float]:
        """Exit code, output, and seconds from the first signal to the launcher's exit."""
        try:
            text, _ = self.proc.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the launcher did not end within {seconds} s")
        return self.proc.returncode, text, time.monotonic() - self.signalled

    def kill(self):
        for pid in processes_mentioning(self.marker):
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


def gone(marker: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not processes_mentioning(marker)


# ---------------------------------------------------------------- whole jobs
@pytest.mark.parametrize("signum, terminal", [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGHUP, True)],
                         ids=["ctrl-c", "kill", "hang-up"])
def test_one_stop_signal_is_a_clean_stop_with_a_checkpoint(tmp_path, signum, terminal):
    job = Launched(tmp_path / "runs")
    try:
        job.wait_for_training()
        job.signal(signum, terminal)
        code, text, took = job.finish(120)
        assert code == 75, text[-3000:]  # EX_TEMPFAIL: checkpointed, resume it
        assert processes_mentioning(job.marker) == []  # when the launcher is gone, so is every rank
        assert text.count("stopping the job cleanly") == 1, text[-3000:]
        assert f"{signal.Signals(signum).name}: stopping the job cleanly" in text
        with h5py.File(job.run_dir / "run.h5", "r") as f:
            assert f.attrs["status"] == "preempted", dict(f.attrs)
            assert f.attrs["stop_reason"].startswith("preempted: SIGUSR1 on rank"), f.attrs["stop_reason"]
            steps = int(f["learner/train/train_steps"][-1])
        assert checkpoint.checkpoints(job.run_dir)[-1].name == f"ckpt-{steps:010d}.pt"
        assert f"--resume {job.run_dir}" in text
        print(f"{signal.Signals(signum).name}: clean stop {took:.1f} s after the signal")
    finally:
        job.kill()


def test_a_second_ctrl_c_kills_at_once(tmp_path):
    job = Launched(tmp_path / "runs", "--grace", "300")
    try:
        job.wait_for_training(steps=50)
        job.signal(signal.SIGINT, terminal=True)
        time.sleep(0.05)
        job.signal(signal.SIGINT, terminal=True)
        code, text, took = job.finish(60)
        assert "SIGINT again: killing the job now" in text
        assert code == 128 + signal.SIGKILL and took < 10, (code, took, text[-2000:])
        # Open MPI's ranks lead process groups of their own: killing mpiexec's group would leave them running
        assert processes_mentioning(job.marker) == [], "ranks outlived the launcher"
        print(f"second Ctrl-C: launcher gone {took:.2f} s after the first")
    finally:
        job.kill()


def test_a_launcher_killed_outright_takes_its_job_along(tmp_path):
    job = Launched(tmp_path / "runs")
    try:
        job.wait_for_training(steps=50)
        job.signal(signal.SIGKILL, terminal=False)  # no handler runs: mpiexec's parent-death signal does the work
        job.proc.wait(timeout=10)
        assert gone(job.marker, 30), f"ranks still running after the launcher died: {processes_mentioning(job.marker)}"
    finally:
        job.kill()


def test_grace_must_be_a_finite_positive_number(tmp_path):
    for bad in ("nan", "inf", "0", "-1"):
        proc = subprocess.run([sys.executable, "-m", "mpirl", "launch", str(JOBS / "cartpole.toml"), "--grace", bad],
                              capture_output=True, text=True, env=mpi_env(), cwd=ROOT, timeout=60)
        assert proc.returncode == 2 and proc.stderr.startswith("mpirl: error: --grace: "), (bad, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and not proc.stdout, (bad, proc.stdout + proc.stderr)


# ---------------------------------------------------------------- the supervision alone, with a stand-in mpiexec
SUPERVISE = ("import sys; from mpirl.launcher import supervise; "
             "sys.exit(supervise(sys.argv[3:], None, float(sys.argv[1]), kill_after=float(sys.argv[2])))")

# Stands in for mpiexec: starts a "rank" that leads a process group of its own and ignores SIGTERM (as Open MPI's
# ranks lead their own groups), then ignores every stop request too. argv: marker (a path; ".ready" is created).
STUBBORN = r"""
import signal, subprocess, sys, time
marker = sys.argv[1]
rank = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                         "open(__import__('sys').argv[1] + '.ready', 'w').close(); time.sleep(120)", marker],
                        process_group=0)
for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)
time.sleep(120)
"""


def stand_in(tmp_path, grace: float, kill_after: float) -> Launched:
    marker = tmp_path / "stand-in"
    cmd = [sys.executable, "-c", SUPERVISE, str(grace), str(kill_after), sys.executable, "-c", STUBBORN, str(marker)]
    job = Launched(marker, cmd=cmd)
    job.wait_for(tmp_path / "stand-in.ready")
    assert len(processes_mentioning(job.marker)) == 3  # the launcher, the stand-in mpiexec, its rank
    return job


def test_a_job_that_ignores_the_stop_is_terminated_after_the_grace_then_killed(tmp_path):
    job = stand_in(tmp_path, grace=1, kill_after=1)
    try:
        job.signal(signal.SIGINT, terminal=True)
        code, text, took = job.finish(30)
        assert "the job did not stop within 1 s: terminating it" in text, text
        assert code == 128 + signal.SIGKILL and 2 <= took < 8, (code, took, text)
        assert processes_mentioning(job.marker) == [], "a process of the job outlived the launcher"
    finally:
        job.kill()


def test_a_second_stop_kills_every_process_of_the_job(tmp_path):
    job = stand_in(tmp_path, grace=300, kill_after=300)
    try:
        job.signal(signal.SIGINT, terminal=True)
        time.sleep(0.2)
        job.signal(signal.SIGTERM, terminal=False)
        code, text, took = job.finish(30)
        assert "SIGTERM again: killing the job now" in text, text
        assert code == 128 + signal.SIGKILL and took < 5, (code, took, text)
        assert processes_mentioning(job.marker) == [], "a process of the job outlived the launcher"
    finally:
        job.kill()


def test_ctrl_c_during_the_checks_before_the_job_starts_is_one_line(tmp_path):
    # SIGINT's default disposition in the child even when this test runs in the background of a shell (which
    # starts background jobs with SIGINT ignored, and Python keeps an ignored SIGINT ignored).
    proc = subprocess.Popen([sys.executable, "-m", "mpirl", "launch", str(JOBS / "breakout_proposed_small.toml"),
                             "--set", f'run.out_dir="{tmp_path}"'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=mpi_env(), cwd=ROOT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(1.0)  # importing torch and building the Atari env take longer than this
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # never leave a job behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode == 75:
        pytest.skip("the checks finished before the signal: the job started and stopped cleanly")
    assert proc.returncode == 130 and err.strip() == "mpirl: interrupted", (proc.returncode, err[-2000:])
    assert not any(tmp_path.iterdir())
