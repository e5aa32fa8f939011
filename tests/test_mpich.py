"""The cluster's MPI when it is MPICH's family (MPICH, and the MPIs that share its ABI: Intel MPI, Cray MPICH,
MVAPICH): a handful of jobs under MPICH's own ``mpiexec`` (hydra), so nothing Open MPI-only creeps in.

The tier runs in a venv of its own, made by the first test and kept (``.venv-mpich`` in the checkout, remade when
what it was made from changes): the ``mpich`` wheel alone (the requirement is setup.cfg's ``mpich`` extra), with the
test venv's packages on its path. mpi4py's wheel binds at import to the MPI library it finds beside the running
Python, so the same mpi4py runs on MPICH there and on Open MPI in the test venv. ``mpirl launch`` in it finds
hydra's ``mpiexec`` beside that Python, and passes it none of Open MPI's flags.

The jobs: the default job to its target, IMPALA, the gradient family's allreduce (DD-PPO: an MPI window, non-blocking
allreduces), QMIX, and a Ctrl-C on the launcher (a checkpoint, exit 75) then ``--resume``.
"""

from __future__ import annotations

import configparser
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import h5py
import pytest

from mpirl.launcher import MPICH, OPEN_MPI, launch_env, mpi_family

from conftest import JOBS, ROOT, finish, mpi_env, wait_for_train_steps
from mpirl.bench.run_mpi import RunningJob

pytestmark = pytest.mark.mpi

VENV = ROOT / ".venv-mpich"


def _requirement() -> str:
    """setup.cfg's ``mpich`` extra: the one place the tier's MPICH is named."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg["options.extras_require"]["mpich"].strip()


def _made_from() -> str:
    return f"{_requirement()}\n{sys.executable}\n{sysconfig.get_paths()['purelib']}\n"


def mpich_python() -> Path:
    """The tier venv's Python, made first if it is missing or was made from something else."""
    python, stamp = VENV / "bin" / "python", VENV / "made-from"
    made = all((VENV / "bin" / name).exists() for name in ("python", "mpiexec", "mpirl"))
    if made and stamp.exists() and stamp.read_text() == _made_from():
        return python
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(VENV)], check=True, timeout=300)
    got = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                          "--disable-pip-version-check", _requirement()],
                         capture_output=True, text=True, timeout=900)
    assert got.returncode == 0, f"could not install {_requirement()} into {VENV}:\n{got.stdout}{got.stderr}"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # The test venv's packages (mpi4py, torch, mpirl itself, ...) with their own .pth files: addsitedir reads them.
    (Path(purelib) / "mpirl-test-venv.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    # The command as an install makes it (the Slurm templates run `mpirl` from the venv they are given).
    command = VENV / "bin" / "mpirl"
    command.write_text(f"#!{python}\nimport sys\nfrom mpirl.cli import main\nsys.exit(main())\n")
    command.chmod(0o755)
    stamp.write_text(_made_from())
    return python


@pytest.fixture(scope="module")
def python() -> Path:
    return mpich_python()


def launch(python: Path, out: Path, job: str, *sets: str, n: int | None = None, resume: str = "") -> list[str]:
    cmd = [str(python), "-m", "mpirl", "launch", str(JOBS / job), *(["-n", str(n)] if n else []),
           "--set", f'run.out_dir="{out}"', "--set", "log.progress_seconds=0"]
    cmd += [x for s in sets for x in ("--set", s)]
    return cmd + (["--resume", resume] if resume else [])


def run_to_end(cmd: list[str], timeout: float = 600) -> tuple[int, str]:
    with RunningJob(cmd, env=mpi_env(), cwd=ROOT) as job:
        return finish(job, timeout)


def run_attrs(out: Path) -> tuple[Path, dict, dict]:
    """The one run under ``out``: its directory, run.h5's attributes and provenance."""
    runs = sorted(p.parent for p in out.glob("*/run.h5"))
    assert len(runs) == 1, runs
    with h5py.File(runs[0] / "run.h5", "r") as f:
        return runs[0], dict(f.attrs), dict(f["provenance"].attrs)


def test_the_tier_runs_mpich_and_the_launcher_knows_it(python):
    mpiexec = str(python.parent / "mpiexec")
    assert mpi_family(mpiexec) == MPICH and mpi_family(str(Path(sys.executable).parent / "mpiexec")) == OPEN_MPI
    flags, env = launch_env(mpiexec)
    assert flags == [] and "OMPI_ALLOW_RUN_AS_ROOT" not in {k for k in env if k not in os.environ}
    got = subprocess.run([mpiexec, "-n", "2", str(python), "-c",
                          "from mpi4py import MPI; c = MPI.COMM_WORLD; "
                          "seen = c.gather((c.rank, c.size, MPI.Get_library_version().split()[0])); "
                          "c.rank or print(seen)"],
                         capture_output=True, text=True, timeout=120, env=mpi_env())
    assert got.returncode == 0 and got.stdout.strip() == "[(0, 2, 'MPICH'), (1, 2, 'MPICH')]", got


def test_the_default_job_reaches_its_target_under_mpich(python, tmp_path):
    code, text = run_to_end(launch(python, tmp_path, "cartpole.toml"))
    assert code == 0, text
    _, attrs, prov = run_attrs(tmp_path)
    assert attrs["status"] == "completed" and "reached 195" in attrs["stop_reason"], attrs
    assert prov["mpi_library"].startswith("MPICH") and prov["world_size"] == 4, prov


def test_ranks_started_through_a_wrapper_script_all_exit_0_under_hydra(python, tmp_path):
    """A site's wrapper between hydra and each rank (a shell here, as a job script or a module loader is): every rank
    leaves after MPI_Finalize through libc's exit, whose handlers tell hydra's proxy the rank is done; left out (the
    os._exit of Open MPI runs), hydra took the first rank to leave for one that died and killed the others (exit 9 in
    every run of this job)."""
    rank = (f"{python} -m mpirl run {JOBS / 'cartpole.toml'} --set 'run.out_dir=\"{tmp_path}\"' "
            "--set run.train_steps=50 --quiet")
    code, text = run_to_end([str(python.parent / "mpiexec"), "-n", "4", "sh", "-c", rank])
    assert code == 0, text
    _, attrs, prov = run_attrs(tmp_path)
    assert attrs["status"] == "completed" and prov["mpi_library"].startswith("MPICH"), attrs


@pytest.mark.parametrize("job,n,sets,unit", [
    ("impala_cartpole.toml", None, ("run.train_steps=40", "run.wall_seconds=0"), "train_steps 40"),
    ("a3c_cartpole.toml", 4, ("a3c.exchange=allreduce", "run.train_steps=30", "run.wall_seconds=0",
                             "run.target_return=nan"), "30"),
    ("predator_prey_qmix.toml", 5, ("run.train_steps=12", "run.wall_seconds=0", "env.max_episode_steps=25",
                                    "replay.batch_size=8", "replay.learning_starts=8", "replay.capacity=40",
                                    "qmix.test_every=6", "qmix.test_episodes=4", "comm.n_update=2"), "train_steps 12"),
], ids=["impala", "a3c-allreduce", "qmix"])
def test_each_family_runs_every_role_under_mpich(python, tmp_path, job, n, sets, unit):
    code, text = run_to_end(launch(python, tmp_path, job, *sets, n=n))
    assert code == 0, text
    _, attrs, prov = run_attrs(tmp_path)
    assert attrs["status"] == "completed" and unit in attrs["stop_reason"], attrs
    assert prov["mpi_library"].startswith("MPICH"), prov


def test_ctrl_c_under_mpich_checkpoints_and_resume_continues(python, tmp_path):
    cmd = launch(python, tmp_path, "cartpole.toml", "run.train_steps=100000", "run.target_return=nan",
                 "run.env_steps=0", "run.wall_seconds=0", "log.interval=0.2")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=mpi_env(),
                            cwd=ROOT, process_group=0)
    try:
        wait_for_train_steps(proc, tmp_path, 200)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C reaches the launcher's process group
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 75, out
    run_dir, attrs, _ = run_attrs(tmp_path)
    assert attrs["status"] == "preempted", attrs
    with h5py.File(run_dir / "run.h5", "r") as f:
        stopped = int(f["learner"].attrs["train_steps"])
    assert stopped >= 200 and list(run_dir.glob("checkpoints/ckpt-*")), out
    code, text = run_to_end(launch(python, tmp_path, "cartpole.toml", f"run.train_steps={stopped + 30}",
                                   "run.target_return=nan", "run.env_steps=0", "run.wall_seconds=0",
                                   resume=str(run_dir)))
    assert code == 0, text
    _, attrs, _ = run_attrs(tmp_path)
    assert attrs["status"] == "completed" and attrs["stop_reason"] == f"train_steps {stopped + 30} reached", attrs
