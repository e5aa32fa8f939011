"""`mpirl launch` stays the job's parent: Ctrl-C, SIGTERM or a hang-up is the clean stop (a checkpoint, exit 75,
status preempted), a second Ctrl-C kills at once, a stop that takes longer than ``--grace`` is cut short, and
no process of the job outlives the launcher.

A terminal sends Ctrl-C (and a hang-up) to its whole foreground process group, so those tests start the
launcher in a process group of its own and signal the group; ``kill``, ``timeout`` and workflow tools signal
the launcher alone. Every test has a deadline and kills whatever of its job is left.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from mpirl.bench.run_mpi import RunningJob
from mpirl.launcher import SESSION_BASE, launch_env
from mpirl.job import checkpoint

from conftest import JOBS, ROOT, finish, mpi_env, mpiexec, processes_mentioning, ranks_of, wait_for_train_steps

pytestmark = pytest.mark.mpi


class Launched:
    """A launcher (``python -m mpirl launch`` unless ``cmd`` is given) in a process group of its own."""

    def __init__(self, out, *extra, cmd=None):
        self.out, self.marker = out, str(out)
        self.proc = subprocess.Popen(
            cmd or [sys.executable, "-m", "mpirl", "launch", str(JOBS / "cartpole.toml"),
                    "--set", f'run.out_dir="{out}"', "--set", "run.train_steps=100000",
                    "--set", "run.target_return=nan", "--set", "run.env_steps=0", "--set", "log.interval=0.2",
                    "--set", "log.progress_seconds=0.5", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=mpi_env(), cwd=ROOT, process_group=0)
        self.signalled = 0.0
        self.head = ""  # output read before finish() (wait_for_output)

    def wait_for_training(self, steps=300, seconds=300):
        wait_for_train_steps(self.proc, self.out, steps, seconds)

    def wait_for(self, path, seconds=120):
        deadline = time.monotonic() + seconds
        while not path.exists() and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        assert path.exists(), f"{path} did not appear within {seconds} s"

    def wait_for_output(self, text: str, seconds=120) -> None:
        """Until the launcher has written ``text`` (read straight from the pipe, so ``finish`` still gets it all)."""
        deadline = time.monotonic() + seconds
        while text not in self.head and time.monotonic() < deadline and self.proc.poll() is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                self.head += os.read(self.proc.stdout.fileno(), 65536).decode(errors="replace")
        assert text in self.head, f"the launcher did not write {text!r} within {seconds} s: {self.head[-3000:]}"

    def rank_pid(self, rank: int, seconds=120) -> int:
        """PID of a rank of the launcher's job (its mpiexec is the launcher's child)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.proc.poll() is None:
            for launched in children_of(self.proc.pid):
                pid = ranks_of(launched).get(rank)
                if pid:
                    return pid
            time.sleep(0.1)
        pytest.fail(f"no rank {rank} of the launcher's job within {seconds} s")

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
        return self.proc.returncode, self.head + text, time.monotonic() - self.signalled

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

    def session_dir(self) -> Path:
        """The MPI session directory of the launcher's running job (``<its base>/ompi.<mpiexec's PID>``)."""
        mpiexec_pid = children_of(self.proc.pid)[0]
        environ = Path(f"/proc/{mpiexec_pid}/environ").read_bytes().decode(errors="replace").split("\0")
        base = dict(kv.split("=", 1) for kv in environ if "=" in kv)[SESSION_BASE]
        return Path(base) / f"ompi.{mpiexec_pid}"


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def loaded(pid: int, library: str) -> bool:
    """The process has mapped a file whose path contains ``library`` (it has begun importing it)."""
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


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
        session = job.session_dir()
        assert session.is_dir() and session.parent.name.startswith("mpirl-mpi-"), session  # the job's own
        job.signal(signum, terminal)
        code, text, took = job.finish(300)  # the launcher kills a stop that takes longer than its 120 s grace
        assert code == 75, text[-3000:]  # EX_TEMPFAIL: checkpointed, resume it
        assert processes_mentioning(job.marker) == []  # when the launcher is gone, so is every rank
        assert not session.parent.exists(), session  # and so is its session directory
        assert text.count("stopping the job cleanly") == 1, text[-3000:]
        assert f"{signal.Signals(signum).name}: stopping the job cleanly" in text
        with h5py.File(job.run_dir / "run.h5", "r") as f:
            assert f.attrs["status"] == "preempted", dict(f.attrs)
            assert f.attrs["stop_reason"].startswith("preempted: SIGUSR1 on rank"), f.attrs["stop_reason"]
            steps = int(f["learner/train/train_steps"][-1])
        assert checkpoint.checkpoints(job.run_dir)[-1].name == f"ckpt-{steps:010d}.pt"
        assert f"--resume {job.run_dir}" in text
        # the progress line (to a pipe: plain lines) while it ran, none after the summary
        head, summary = text.split("\nrun           cartpole", 1)
        assert re.search(r"^mpirl: \d+:\d\d  [-\d,]+ train steps  ", head, re.M), head[-3000:]
        assert not re.search(r"^mpirl: \d+:\d\d  ", summary, re.M), summary
        print(f"{signal.Signals(signum).name}: clean stop {took:.1f} s after the signal")
    finally:
        job.kill()


def test_a_second_ctrl_c_kills_at_once(tmp_path):
    job = Launched(tmp_path / "runs", "--grace", "300")
    try:
        job.wait_for_training(steps=50)
        # The learner held still: the clean stop cannot finish before the second Ctrl-C, however slow this
        # machine is at handling the first (SIGKILL ends a stopped process all the same).
        os.kill(job.rank_pid(0), signal.SIGSTOP)
        job.signal(signal.SIGINT, terminal=True)
        job.wait_for_output("stopping the job cleanly")  # the first was taken: two would not merge into one
        job.signal(signal.SIGINT, terminal=True)
        code, text, took = job.finish(60)  # 60 s: far inside the 300 s grace, so the kill did not wait for it
        assert "SIGINT again: killing the job now" in text
        assert code == 128 + signal.SIGKILL, (code, took, text[-2000:])
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
        job.proc.wait(timeout=60)
        assert gone(job.marker, 120), f"ranks still running after the launcher died: {processes_mentioning(job.marker)}"
    finally:
        job.kill()


BECOME_THE_NEXT_MPIEXEC = """
import os, shutil, sys
killed, base, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
mine = str(os.getpid())  # what the mpiexec exec'd below will have: PIDs come round, here at once
left, dst = os.path.join(base, "ompi." + killed), os.path.join(base, "ompi." + mine)
shutil.copytree(left, dst)
for name in os.listdir(dst):
    os.rename(os.path.join(dst, name), os.path.join(dst, name.replace(killed, mine)))
os.execv(argv[0], argv)
"""


def test_a_session_a_killed_mpiexec_left_cannot_stop_a_later_job(tmp_path):
    """Open MPI 5's mpiexec will not start over the session directory a killed mpiexec of the same PID left behind
    (exit 213, "The PMIx server's listener thread failed to start"); each job of ours keeps its session in a
    directory of its own, so one job's leftovers never meet another."""
    shared = tmp_path / "shared"  # one base for every mpiexec, as /tmp is for plain mpiexec
    shared.mkdir()
    flags = launch_env(mpiexec())[0]
    sleeper = [mpiexec(), "-n", "1", *flags, sys.executable, "-c", "import time; time.sleep(600)"]
    with RunningJob(sleeper, env={**mpi_env(), SESSION_BASE: str(shared)}) as killed:
        left = shared / f"ompi.{killed.pid}"
        assert killed.wait_until(lambda: list(left.glob("pmix.*")), 300), killed.output
        killed.kill()  # SIGKILL: mpiexec gets no chance to clean up
    assert list(left.glob("pmix.*")), "a killed mpiexec left no session behind: nothing to test"

    def next_job(env: dict) -> tuple[int, str]:
        cmd = [sys.executable, "-c", BECOME_THE_NEXT_MPIEXEC, str(killed.pid), str(shared),
               mpiexec(), "-n", "1", *flags, sys.executable, "-c", "pass"]
        with RunningJob(cmd, env=env) as job:
            return finish(job, 300)
    code, output = next_job({**mpi_env(), SESSION_BASE: str(shared)})  # plain mpiexec's lot
    assert code == 213 and "listener thread failed to start" in output, (
        f"Open MPI started over a killed mpiexec's session (exit {code}): if it no longer refuses, own_session_dir "
        f"is not needed any more\n{output[-2000:]}")
    code, output = next_job(mpi_env())  # ours: RunningJob (as mpirl launch) gives the job a session of its own
    assert code == 0, output[-2000:]
    print(f"a plain mpiexec over the leftover: exit 213; ours: exit {code}")


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
        code, text, took = job.finish(60)  # the stand-in sleeps 120 s: ended within 60 s, it was ended
        assert "the job did not stop within 1 s: terminating it" in text, text
        assert "the job is still there 1 s after SIGTERM: killing it" in text, text
        assert code == 128 + signal.SIGKILL and took >= 2, (code, took, text)  # the grace and kill_after waited out
        assert processes_mentioning(job.marker) == [], "a process of the job outlived the launcher"
    finally:
        job.kill()


def test_a_second_stop_kills_every_process_of_the_job(tmp_path):
    job = stand_in(tmp_path, grace=300, kill_after=300)
    try:
        job.signal(signal.SIGINT, terminal=True)
        time.sleep(0.2)
        job.signal(signal.SIGTERM, terminal=False)
        code, text, took = job.finish(60)  # 60 s: far inside the 300 s grace, so the kill did not wait for it
        assert "SIGTERM again: killing the job now" in text, text
        assert "terminating it" not in text, text  # killed at once, not after the grace
        assert code == 128 + signal.SIGKILL, (code, took, text)
        assert processes_mentioning(job.marker) == [], "a process of the job outlived the launcher"
    finally:
        job.kill()


@pytest.mark.mpi
def test_ctrl_c_while_the_ranks_start_is_a_clean_stop(tmp_path):
    """Ctrl-C before the job's ranks are up (rank 0 is importing torch for the job's checks): every rank notes the
    stop it is sent while it starts, the job starts and stops at once the clean way (a checkpoint, exit 75,
    preempted), and no rank dies of the signal."""
    # SIGINT's default disposition in the child even when this test runs in the background of a shell (which
    # starts background jobs with SIGINT ignored, and Python keeps an ignored SIGINT ignored).
    proc = subprocess.Popen([sys.executable, "-m", "mpirl", "launch", str(JOBS / "cartpole.toml"),
                             "--set", f'run.out_dir="{tmp_path}"'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=mpi_env(), cwd=ROOT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = processes_mentioning(str(tmp_path))
            if any(loaded(pid, "torch") for pid in ranks if pid != proc.pid):  # a rank has begun importing it
                break
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:  # never leave a job behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 75, (proc.returncode, out[-2000:], err[-2000:])
    assert "exited on signal" not in out + err and "Traceback" not in out + err, out[-2000:] + err[-2000:]
    (run,) = [p.parent for p in tmp_path.glob("*/run.h5")]
    with h5py.File(run / "run.h5", "r") as f:
        assert f.attrs["status"] == "preempted" and f.attrs["stop_reason"].startswith("preempted: SIGUSR1 on rank")
    assert list((run / "checkpoints").glob("ckpt-*.pt")), "no checkpoint at the stop"


def test_ranks_that_outnumber_the_cores_wait_without_spinning(tmp_path):
    """One rank more than the cores this machine gives the job: every rank sets OMP_WAIT_POLICY=PASSIVE before torch
    starts its threads (mpirl/job/waiting.py); a policy the user set stands; ranks that fit the cores keep the
    default."""
    from mpirl.job.waiting import node_cores
    cores = len(node_cores())
    code = ("import os, sys; from mpi4py import MPI; from mpirl.job.waiting import passive_when_oversubscribed as p; "
            "got = MPI.COMM_WORLD.gather((p(MPI.COMM_WORLD), os.environ.get('OMP_WAIT_POLICY'))); "
            "MPI.COMM_WORLD.rank or print(sorted(set(got)))")
    for n, env, want in ((cores + 1, {}, "[(True, 'PASSIVE')]"), (cores + 1, {"OMP_WAIT_POLICY": "ACTIVE"},
                                                                  "[(False, 'ACTIVE')]"),
                         (min(cores, 2), {}, "[(False, None)]")):
        base = {k: v for k, v in mpi_env().items() if k != "OMP_WAIT_POLICY"}
        got = subprocess.run([mpiexec(), "-n", str(n), *launch_env(mpiexec())[0], sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=120, env={**base, **env}, cwd=ROOT)
        assert got.returncode == 0 and got.stdout.strip() == want, (n, env, got.stdout, got.stderr)
