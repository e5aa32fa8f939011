"""The batch templates on a real Slurm: slurmctld, slurmd and munged on this machine.

The cluster (``slurm_cluster.py``) is started once for the module, installing
Debian's slurm-wlm, munge and libpmix2 with apt when they are missing. Each test
submits a template from ``slurm/`` with ``sbatch``, waits with a timeout, and
checks the job's state and the HDF5 files the run wrote. Where Slurm cannot
start here (not root, no apt), the tests skip and say why.
"""

import sys
import re
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpirl.roles import checkpoint

import slurm_cluster
from conftest import ROOT

pytestmark = [pytest.mark.mpi, pytest.mark.slurm]

SHORT = ("--set", "run.train_steps=400", "--set", "run.target_return=nan", "--set", "run.env_steps=0",
         "--set", "replay.learning_starts=300")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        c = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    except (slurm_cluster.Unavailable, OSError) as err:
        pytest.skip(f"no Slurm here: {err}")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Two slurmd (n1, n2) on this machine: a multi-node allocation, though both nodes are one host."""
    try:
        c = slurm_cluster.start(tmp_path_factory.mktemp("slurm2"), nodes=2)
    except (slurm_cluster.Unavailable, OSError) as err:
        pytest.skip(f"no Slurm here: {err}")
    yield c
    c.stop()


def submit(cluster, out: Path, template: str, *args: str, env: dict | None = None, sbatch=()) -> str:
    """sbatch a template from the project directory; run output goes under ``out``; returns the job id."""
    out.mkdir(parents=True, exist_ok=True)
    e = {**cluster.env, "MPIRL_VENV": str(Path(sys.executable).parent.parent), **(env or {})}
    r = slurm_cluster._run(["sbatch", "--parsable", f"--chdir={ROOT}", f"--output={out}/slurm-%j.out",
                            *sbatch, str(ROOT / "slurm" / template), *args, "--set", f'run.out_dir="{out}"'],
                           env=e)
    return r.stdout.strip().split(";")[0]


def wait_for(cluster, job_id: str, out: Path, timeout: float = 240, states=("COMPLETED", "FAILED", "CANCELLED",
                                                                           "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")):
    deadline = time.monotonic() + timeout
    info = {}
    while time.monotonic() < deadline:
        info = cluster.job_state(job_id)
        if info.get("JobState") in states:
            return info
        time.sleep(1)
    cluster.run("scancel", job_id, check=False)
    pytest.fail(f"job {job_id} not finished within {timeout} s: {info}\n{log_of(out, job_id)[-4000:]}")


def log_of(out: Path, job_id: str) -> str:
    p = out / f"slurm-{job_id}.out"
    return p.read_text() if p.exists() else "(no output file)"


def only_run(out: Path) -> Path:
    runs = sorted(p.parent for p in out.glob("*/run.h5"))
    assert len(runs) == 1, runs
    return runs[0]


def check_run(run_dir: Path, job_id: str, steps: int = 400):
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed", dict(f.attrs)
        assert str(f["provenance"].attrs["slurm_job_id"]) == job_id
        np.testing.assert_array_equal(f["learner/batches/train_step"][()], np.arange(1, steps + 1))
        assert f["buffer_1/buffer/experiences_in"][-1] > 0


@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_single_node_template(cluster, tmp_path, launcher):
    job = submit(cluster, tmp_path, "single_node.sbatch", "jobs/cartpole.toml", *SHORT,
                 env={"MPIRL_LAUNCHER": launcher})
    info = wait_for(cluster, job, tmp_path)
    log = log_of(tmp_path, job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    assert f"mpirl: {launcher} step on 4 tasks" in log
    assert "Sorry!" not in log  # no PMIx help-file noise from the ranks
    check_run(only_run(tmp_path), job)


def test_multi_node_template_in_a_two_node_allocation(two_nodes, tmp_path):
    # mpiexec inside the allocation (srun --mpi=pmix cannot span two slurmd on one host: their step
    # daemons collide on /tmp/spmix_appdir_<uid>_<job>.<step>; on real nodes that path is per host).
    job = submit(two_nodes, tmp_path, "multi_node.sbatch", "jobs/cartpole.toml", *SHORT,
                 env={"MPIRL_LAUNCHER": "mpiexec"}, sbatch=("--nodes=2", "--ntasks=4"))
    info = wait_for(two_nodes, job, tmp_path)
    log = log_of(tmp_path, job)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "n[1-2]", (info, log)
    assert "mpirl: mpiexec step on 4 tasks (n[1-2])" in log
    check_run(only_run(tmp_path), job)


def test_preempted_job_requeues_and_resumes(cluster, tmp_path):
    long = ("--set", "run.train_steps=4000", "--set", "run.target_return=nan", "--set", "run.env_steps=0",
            "--set", "replay.learning_starts=300")
    job = submit(cluster, tmp_path, "preemptible.sbatch", "jobs/cartpole.toml", *long)
    deadline = time.monotonic() + 120
    learner = None
    while time.monotonic() < deadline:  # wait until the learner has trained a while
        learner = next(tmp_path.glob("*/learner.h5"), None)
        if learner:
            try:
                with h5py.File(learner, "r", locking=False) as f:
                    if len(f["train/train_steps"]) and f["train/train_steps"][-1] >= 500:
                        break
            except (OSError, KeyError):
                pass
        time.sleep(0.5)
    else:
        pytest.fail(f"the job did not train 500 steps within 120 s\n{log_of(tmp_path, job)}")
    # what the scheduler does before a time limit (--signal=B:USR1@120) or at preemption
    cluster.run("scancel", "--batch", "--signal=USR1", job)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and int(cluster.job_state(job).get("Restarts", 0)) < 1:
        time.sleep(1)
    assert int(cluster.job_state(job).get("Restarts", 0)) >= 1, log_of(tmp_path, job)
    # Slurm holds a requeued job back ~2.5 minutes (here: until its old instance's revoked job
    # credential cannot be confused with the new one, whose time stamps have one-second resolution).
    # Once it is pending, wait out that second with margin and let it start now.
    deadline = time.monotonic() + 60
    while cluster.job_state(job).get("JobState") != "PENDING" and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)
    cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
    info = wait_for(cluster, job, tmp_path, timeout=300)
    log = log_of(tmp_path, job)
    assert info["JobState"] == "COMPLETED", log
    assert "requeueing job" in log and "resuming" in log
    run_dir = only_run(tmp_path)
    check_run(run_dir, job, steps=4000)
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["restarts"] == 1
        assert re.match(r"ckpt-\d{10}\.pt", f.attrs["resume_1_checkpoint"])
    assert checkpoint.checkpoints(run_dir)[-1].name == "ckpt-0000004000.pt"


def test_job_array_sweeps_architectures_and_seeds(cluster, tmp_path):
    job = submit(cluster, tmp_path, "sweep.sbatch", "jobs/cartpole.toml", *SHORT, sbatch=("--array=0-1",))
    for task in ("0", "1"):
        info = wait_for(cluster, f"{job}_{task}", tmp_path, timeout=300)
        assert info["JobState"] == "COMPLETED", log_of(tmp_path, f"{job}_{task}")
    runs = sorted(p.parent.name for p in tmp_path.glob("*/run.h5"))
    assert [r.rsplit("-", 2)[0] for r in runs] == ["cartpole-baseline-s1", "cartpole-proposed-s1"], runs
