"""The batch templates on a real Slurm: munged, slurmctld and slurmd on this machine.

The clusters (``slurm_cluster.py``) are started once for the module, installing
Debian's slurm-wlm, munge, libpmix2 and libpmix-dev with apt when they are missing:
one node, and two nodes (n1, n2) whose slurmd each run in a namespace with their
own /tmp, /dev/shm and host name, so that one ``srun --mpi=pmix`` step spans both
as it would two hosts. Each test submits a template from ``slurm/`` with
``sbatch``, waits with a timeout, and checks the job's state and the HDF5 files the
run wrote. Each cluster's fixture checks at its end that no process it started is
left. Where Slurm cannot start here (not root, no apt), the tests skip and say why.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpirl.job import checkpoint

import slurm_cluster
from conftest import ROOT

pytestmark = [pytest.mark.mpi, pytest.mark.slurm]

SHORT = ("--set", "run.train_steps=400", "--set", "run.target_return=nan", "--set", "run.env_steps=0",
         "--set", "replay.learning_starts=300")
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def start_cluster(tmp_path_factory, name: str, nodes: int = 1) -> slurm_cluster.Cluster:
    """A cluster whose jobs see the tests' temporary directories (run output goes there)."""
    try:
        return slurm_cluster.start(tmp_path_factory.mktemp(name), nodes=nodes,
                                   shared=(tmp_path_factory.getbasetemp(),))
    except slurm_cluster.Unavailable as err:
        pytest.skip(f"no Slurm here: {err}")


def stop_cluster(cluster: slurm_cluster.Cluster) -> None:
    left = cluster.stop()
    assert not left, f"processes the test cluster started are still running after stop(): {left}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory, "slurm")
    yield c
    stop_cluster(c)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Two slurmd (n1, n2) on this machine, each in a namespace of its own; n1 has a (pretend) GPU."""
    c = start_cluster(tmp_path_factory, "slurm2", nodes=2)
    yield c
    stop_cluster(c)


def submit(cluster, out: Path, template: str, *args: str, env: dict | None = None, sbatch=()) -> str:
    """sbatch a template from the project directory; run output goes under ``out``; returns the job id."""
    out.mkdir(parents=True, exist_ok=True)
    e = {**cluster.env, "MPIRL_VENV": str(Path(sys.executable).parent.parent), **(env or {})}
    r = slurm_cluster._run(["sbatch", "--parsable", f"--chdir={ROOT}", f"--output={out}/slurm-%j.out",
                            *sbatch, str(ROOT / "slurm" / template), *args, "--set", f'run.out_dir="{out}"'],
                           env=e)
    return r.stdout.strip().split(";")[0]


def wait_for(cluster, job_id: str, out: Path, timeout: float = 600) -> dict:
    """Wait until the job (every component of a heterogeneous one) has ended; its (first component's) state."""
    deadline = time.monotonic() + timeout
    parts = []
    while time.monotonic() < deadline:
        parts = cluster.job_components(job_id)
        if parts and all(p.get("JobState") in FINAL for p in parts):
            return parts[0]
        time.sleep(1)
    cluster.run("scancel", job_id, check=False)
    states = [(p.get("JobState"), p.get("Reason")) for p in parts]
    pytest.fail(f"job {job_id} not finished within {timeout} s: {states}\n{log_of(out, job_id)[-4000:]}")


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
        buffers = [g for g in f if g.startswith("buffer_")]  # buffer_1, or buffer_2 after two learners
        assert buffers and all(f[g]["buffer/experiences_in"][-1] > 0 for g in buffers), buffers


@pytest.mark.parametrize("launcher", ["srun", "mpiexec", "srun/mpich", "mpiexec/mpich"])
def test_single_node_template(cluster, tmp_path, launcher):
    """Both launchers, with the Open MPI of the test venv and with MPICH (tests/test_mpich.py's venv): the template
    tells the two apart and starts each with its own flags (srun: PMIx for Open MPI, PMI-2 for MPICH)."""
    launcher, _, mpi = launcher.partition("/")
    env = {"MPIRL_LAUNCHER": launcher}
    if mpi:
        from test_mpich import mpich_python
        env["MPIRL_VENV"] = str(mpich_python().parent.parent)
    job = submit(cluster, tmp_path, "single_node.sbatch", "jobs/cartpole.toml", *SHORT,
                 "--set", "log.progress_seconds=0.5", env=env)
    info = wait_for(cluster, job, tmp_path)
    log = log_of(tmp_path, job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    assert f"mpirl: {launcher} step on 4 tasks" in log
    assert "Sorry!" not in log  # no PMIx help-file noise from the ranks
    check_run(only_run(tmp_path), job)
    with h5py.File(only_run(tmp_path) / "run.h5", "r") as f:
        assert f["provenance"].attrs["mpi_library"].startswith("MPICH" if mpi else "Open MPI"), dict(f["provenance"].attrs)
        assert f["provenance"].attrs["world_size"] == 4
    # No `mpirl launch` here: rank 0's follower appended the progress line to the output file, none after the summary
    head, summary = log.split("\nrun           cartpole", 1)
    assert re.search(r"^mpirl: \d+:\d\d  [-\d,]+ train steps  ", head, re.M), log
    assert not re.search(r"^mpirl: \d+:\d\d  ", summary, re.M) and "\x1b" not in log, log


def rank_hosts(run_dir: Path) -> list[str]:
    """Each rank's host name as run.h5 recorded it; on the test cluster, the Slurm node that started the rank."""
    with h5py.File(run_dir / "run.h5", "r") as f:
        return str(f["provenance"].attrs["rank_hosts"]).split(",")


def launched_on(cluster, job_id: str) -> list[str]:
    """The nodes whose slurmd launched tasks of the job's first step, from the slurmd logs (Slurm's view)."""
    step = re.compile(rf"launch task (StepId=)?{job_id}(\+\d+)?\.0 ")  # "StepId=7.0", a het job's "7+1.0"
    return [n for n in cluster.nodes if step.search((cluster.work / "log" / f"slurmd-{n}.log").read_text())]


def test_each_node_has_its_own_tmp_shm_and_host_name(two_nodes):
    # What lets one step span two slurmd on one machine: Slurm's PMIx plugin makes
    # /tmp/spmix_appdir_<uid>_<job>.<step> on every node of a step, Open MPI and PMIx keep session
    # files under /tmp and /dev/shm, and a rank's host name is its node's.
    out = two_nodes.run("srun", "--nodes=2", "--ntasks=2", "sh", "-c",
                        "touch /tmp/mark-$SLURMD_NODENAME /dev/shm/mark-$SLURMD_NODENAME; "
                        "echo $SLURMD_NODENAME $(hostname) $(ls /dev/shm)", timeout=60).stdout
    assert sorted(out.splitlines()) == ["n1 n1 mark-n1", "n2 n2 mark-n2"], out
    for node, other in (("n1", "n2"), ("n2", "n1")):
        assert (two_nodes.node_tmp(node) / f"mark-{node}").exists()
        assert not (two_nodes.node_tmp(node) / f"mark-{other}").exists()
    assert not Path("/tmp/mark-n1").exists() and not Path("/dev/shm/mark-n1").exists()


def two_node_job(cluster, tmp_path, template: str, launcher: str, tasks: int) -> tuple[str, str, Path]:
    """The CartPole job of ``template`` on ``tasks`` tasks over both nodes, completed and checked (check_run):
    its id, log and run directory."""
    job = submit(cluster, tmp_path, template, "jobs/cartpole.toml", *SHORT,
                 env={"MPIRL_LAUNCHER": launcher}, sbatch=("--nodes=2", f"--ntasks={tasks}"))
    info = wait_for(cluster, job, tmp_path)
    log = log_of(tmp_path, job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0" and info["NodeList"] == "n[1-2]", \
        (info, log)
    assert f"mpirl: {launcher} step on {tasks} tasks (n[1-2])" in log
    assert "Sorry!" not in log  # no PMIx help-file noise from the ranks
    run_dir = only_run(tmp_path)
    check_run(run_dir, job)
    return job, log, run_dir


@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_multi_node_template_over_two_nodes(two_nodes, tmp_path, launcher):
    job, _, run_dir = two_node_job(two_nodes, tmp_path, "multi_node.sbatch", launcher, 4)
    hosts = rank_hosts(run_dir)
    assert hosts[0] == "n1" and set(hosts) == {"n1", "n2"}, hosts  # the learner on the first node; both used
    if launcher == "srun":  # one step, its tasks started by both slurmd
        assert launched_on(two_nodes, job) == ["n1", "n2"]


# srun only (the suite's time): the mpiexec path (MPIRL_DISTRIBUTION=cyclic -> --map-by node) passed the same test
# when the template was written; test_multi_node_template_over_two_nodes runs both launchers.
@pytest.mark.parametrize("launcher", ["srun"])
def test_learners_template_puts_a_learner_on_each_node(two_nodes, tmp_path, launcher):
    # 6 tasks on 2 nodes: the template sets topology.learners=2 (one per node), 1 buffer, 3 actors.
    _, log, run_dir = two_node_job(two_nodes, tmp_path, "learners.sbatch", launcher, 6)
    assert "mpirl: one learner per node: --set topology.learners=2" in log, log
    hosts = rank_hosts(run_dir)
    assert len(hosts) == 6 and hosts[:2] == ["n1", "n2"], hosts  # learner 0 on n1, learner 1 on n2
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert "buffer_2" in f, list(f)  # the buffer after the two learners
        first, second = (dict(f[g].attrs) for g in ("learner", "learner_1"))
    assert (first["learner"], second["learner"], first["learners"], second["learners"]) == (0, 1, 2, 2), (first, second)
    assert first["train_steps"] == second["train_steps"] == 400, (first, second)
    assert first["params_crc32"] == second["params_crc32"], (first, second)  # identical networks at the end


def test_hetjob_template_puts_the_learner_on_the_gpu_node(two_nodes, tmp_path):
    # The template's CPU component asks for 10 tasks; 3 here (an option after ":" is the second component's).
    job = submit(two_nodes, tmp_path, "hetjob.sbatch", "jobs/cartpole.toml", *SHORT, sbatch=(":", "--ntasks=3"))
    wait_for(two_nodes, job, tmp_path)
    log = log_of(tmp_path, job)
    parts = two_nodes.job_components(job)
    assert [(p["JobState"], p["ExitCode"]) for p in parts] == [("COMPLETED", "0:0")] * 2, (parts, log)
    # component 0 (one task, --gres=gpu:1) on n1, the only node with a GPU; component 1 on the other node
    assert [p["NodeList"] for p in parts] == ["n1", "n2"], parts
    assert "gpu" in parts[0].get("TresPerNode", ""), parts[0]
    assert "mpirl: heterogeneous step: learner on n1, 3 tasks on n2" in log, log
    assert "Sorry!" not in log
    run_dir = only_run(tmp_path)
    check_run(run_dir, job)
    assert rank_hosts(run_dir) == ["n1", "n2", "n2", "n2"]  # one MPI_COMM_WORLD over both components
    assert launched_on(two_nodes, job) == ["n1", "n2"]


def test_stop_ends_every_process_the_cluster_started(tmp_path_factory):
    c = start_cluster(tmp_path_factory, "slurm-stop", nodes=2)
    # A munged the cluster did not start (like the machine's own) must survive its stop.
    other = Path(tempfile.mkdtemp(prefix="mpirl-test-other-munge-", dir="/run"))
    other.chmod(0o755)
    (other / "key").write_bytes(os.urandom(1024))
    (other / "key").chmod(0o400)
    bystander = subprocess.Popen(["munged", "--foreground", f"--socket={other}/socket", f"--key-file={other}/key",
                                  f"--pid-file={other}/pid", f"--seed-file={other}/seed"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        try:
            # A job still running on both nodes, and a process that escaped it (its parent gone, a session of
            # its own): cancelling the job leaves that one running (seen here), only the namespace sweep ends it.
            job = c.run("sbatch", "--parsable", "--nodes=2", "--ntasks=2", f"--output={c.work}/job-%j.out", "--wrap",
                        "(setsid sleep 301 </dev/null >/dev/null 2>&1 &); srun sleep 300 & wait").stdout.strip()
            sleeps = {"on n1: sleep 301", "on n1: /usr/bin/sleep 300", "on n2: /usr/bin/sleep 300"}
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                running = c.processes()
                if sleeps <= set(running.values()):
                    break
                time.sleep(0.5)
            else:
                pytest.fail(f"job {job} did not start its sleeps on both nodes within 180 s: {c.processes()}")
            namespaces = set(c.namespaces.values())
        finally:
            left = c.stop()
        assert not left, f"still running after stop(): {left}"
        assert not [pid for pid in running if slurm_cluster._alive(pid)]
        in_nodes = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and slurm_cluster._alive(int(p.name))
                    and slurm_cluster._mount_ns(p.name) in namespaces]
        assert not in_nodes, f"processes still in the nodes' namespaces: {in_nodes}"
        assert not c.munge_socket.parent.exists()
        assert bystander.poll() is None, "stop() ended a munged it had not started"
    finally:
        bystander.terminate()
        bystander.wait(timeout=15)
        shutil.rmtree(other, ignore_errors=True)


def preempt_and_requeue(cluster, job: str, out: Path, ready, what: str) -> dict:
    """Once ``ready()`` (polled for up to 300 s), signal the batch shell as the scheduler does before a time limit
    (``--signal=B:USR1@120``) or at preemption; wait for the requeue and let it start; the job's final state."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not ready():
        time.sleep(0.5)
    if not ready():
        pytest.fail(f"the job did not {what} within 300 s\n{log_of(out, job)}")
    cluster.run("scancel", "--batch", "--signal=USR1", job)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and int(cluster.job_state(job).get("Restarts", 0)) < 1:
        time.sleep(1)
    assert int(cluster.job_state(job).get("Restarts", 0)) >= 1, log_of(out, job)
    # Slurm holds a requeued job back ~2.5 minutes (here: until its old instance's revoked job
    # credential cannot be confused with the new one, whose time stamps have one-second resolution).
    # Once it is pending, wait out that second with margin and let it start now.
    deadline = time.monotonic() + 180
    while cluster.job_state(job).get("JobState") != "PENDING" and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)
    cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
    return wait_for(cluster, job, out, timeout=600)


def rows(out: Path, file: str, column: str) -> np.ndarray:
    """A column of the run's file so far (empty while it does not exist or is being made)."""
    for path in out.glob(f"*/{file}"):
        try:
            with h5py.File(path, "r", locking=False) as f:
                return f[column][()]
        except (OSError, KeyError):
            pass
    return np.zeros(0)


def requeued(cluster, job: str, out: Path, ready, what: str) -> Path:
    """Preempt ``job`` once ``ready()``; it requeues, resumes and completes: its run directory."""
    info = preempt_and_requeue(cluster, job, out, ready, what)
    log = log_of(out, job)
    assert info["JobState"] == "COMPLETED", log
    assert "requeueing job" in log and "resuming" in log
    return only_run(out)


def resumed_once(run_dir: Path, job: str, stop_reason: str, suffix: str) -> None:
    """run.h5 says: completed after one restart from a ``ckpt-*{suffix}`` checkpoint, stopped by ``stop_reason``,
    under Slurm job ``job``."""
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["restarts"] == 1, dict(f.attrs)
        assert f.attrs["stop_reason"] == stop_reason
        assert re.match(rf"ckpt-\d{{10}}{re.escape(suffix)}$", f.attrs["resume_1_checkpoint"])
        assert str(f["provenance"].attrs["slurm_job_id"]) == job


def test_preempted_job_requeues_and_resumes(cluster, tmp_path):
    long = ("--set", "run.train_steps=2000", "--set", "run.target_return=nan", "--set", "run.env_steps=0",
            "--set", "replay.learning_starts=300", "--set", "log.flush_seconds=0.5")  # preempted at 500: 1,500 steps
    # of margin for the signal, which follows the rows' flush (every 0.5 s, not the default 2 s) within a second
    job = submit(cluster, tmp_path, "preemptible.sbatch", "jobs/cartpole.toml", *long)
    steps = lambda: rows(tmp_path, "learner.h5", "train/train_steps")  # noqa: E731
    run_dir = requeued(cluster, job, tmp_path, lambda: len(steps()) and steps()[-1] >= 500, "train 500 steps")
    check_run(run_dir, job, steps=2000)
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["restarts"] == 1
        assert re.match(r"ckpt-\d{10}\.pt", f.attrs["resume_1_checkpoint"])
    assert checkpoint.checkpoints(run_dir)[-1].name == "ckpt-0000002000.pt"


def test_preempted_distql_job_requeues_and_resumes(cluster, tmp_path):
    """The same template for a DistQL job (its checkpoints are HDF5, no torch): 3 tasks, the workers slowed to at
    most 5,000 steps/s each, so that 300,000 env steps take a while on any machine."""
    bound = ("--set", "distql.workers=2", "--set", "distql.episodes=10000000", "--set", "run.env_steps=300000",
             "--set", "distql.worker_delay_us=[200]", "--set", "log.flush_seconds=0.5", "--set", "distql.eval_episodes=0")
    job = submit(cluster, tmp_path, "preemptible.sbatch", "jobs/taxi_distql.toml", *bound, sbatch=("--ntasks=3",))
    run_dir = requeued(cluster, job, tmp_path, lambda: len(rows(tmp_path, "qserver.h5", "episodes/time")) >= 100,
                       "play 100 episodes")
    resumed_once(run_dir, job, "env_steps 300000 reached", ".h5")
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f["provenance"].attrs["torch"] == ""
    with h5py.File(run_dir / "qserver.h5", "r") as f:
        e = f["episodes"]
        for w in (1, 2):
            index = e["episode"][()][e["worker"][()] == w]
            assert index.tolist() == list(range(len(index)))  # each episode once, none lost


def test_preempted_impala_job_requeues_and_resumes(cluster, tmp_path):
    """The same template for an IMPALA job (4 tasks: learner, a trajectory queue, two actors): preempted once it
    has trained 200 batches, requeued, resumed from its stop checkpoint, it ends at its 600 train steps with
    every batch's row once."""
    long = ("--set", "run.train_steps=600", "--set", "run.target_return=nan", "--set", "run.env_steps=0",
            "--set", "run.wall_seconds=0", "--set", "impala.test_episodes=0", "--set", "log.flush_seconds=0.5")
    job = submit(cluster, tmp_path, "preemptible.sbatch", "jobs/impala_cartpole.toml", *long)
    steps = lambda: rows(tmp_path, "learner.h5", "train/train_steps")  # noqa: E731
    run_dir = requeued(cluster, job, tmp_path, lambda: len(steps()) and steps()[-1] >= 200, "train 200 steps")
    resumed_once(run_dir, job, "train_steps 600 reached", ".pt")
    with h5py.File(run_dir / "run.h5", "r") as f:
        trained = f["learner/train/train_steps"][()]
    assert np.all(np.diff(trained) > 0) and trained[-1] == 600, trained  # rows after the checkpoint rewritten
    assert checkpoint.checkpoints(run_dir)[-1].name == "ckpt-0000000600.pt"


def test_preempted_allreduce_gradient_job_requeues_and_resumes(cluster, tmp_path):
    """The same template for the gradient family under DD-PPO's allreduce (4 tasks, every one a worker, no server):
    preempted after 200 updates, every rank stops at the same update, rank 0 checkpoints, the job requeues and
    resumes, and ends at its 600 updates with each update's row once."""
    long = ("--set", "run.train_steps=600", "--set", "run.target_return=nan", "--set", "run.wall_seconds=0",
            "--set", "a3c.test_episodes=0", "--set", 'a3c.exchange="allreduce"', "--set", "log.flush_seconds=0.5")
    job = submit(cluster, tmp_path, "preemptible.sbatch", "jobs/a3c_cartpole.toml", *long)
    version = lambda: rows(tmp_path, "updates.h5", "updates/version")  # noqa: E731
    run_dir = requeued(cluster, job, tmp_path, lambda: len(version()) and version()[-1] >= 200, "make 200 updates")
    resumed_once(run_dir, job, "train_steps 600 reached", ".pt")
    with h5py.File(run_dir / "run.h5", "r") as f:
        done = f["updates/updates/version"][()]
    assert np.all(np.diff(done) == 1) and done[-1] == 600, done  # rows after the checkpoint rewritten
    assert checkpoint.checkpoints(run_dir)[-1].name == "ckpt-0000000600.pt"


def test_job_array_sweeps_architectures_and_seeds(cluster, tmp_path):
    job = submit(cluster, tmp_path, "sweep.sbatch", "jobs/cartpole.toml", *SHORT, sbatch=("--array=0-1",))
    for task in ("0", "1"):
        info = wait_for(cluster, f"{job}_{task}", tmp_path, timeout=600)
        assert info["JobState"] == "COMPLETED", log_of(tmp_path, f"{job}_{task}")
    runs = sorted(p.parent.name for p in tmp_path.glob("*/run.h5"))
    assert [r.rsplit("-", 2)[0] for r in runs] == ["cartpole-baseline-s1", "cartpole-proposed-s1"], runs
