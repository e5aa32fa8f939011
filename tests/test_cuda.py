"""The learner's CUDA path through every role: short jobs with ``agent.device = "cuda"``, checked from their HDF5.

Marked ``cuda`` and skipped with the reason "no CUDA device" where torch sees none (hardware, not a missing
package): the suite runs them wherever a GPU is, and ``scripts/gpu_check.sh`` runs them on a GPU machine
(docs/operations.md, "The GPU check"). ``MPIRL_CUDA_TESTS_ON=cpu`` runs the same jobs with ``agent.device = "cpu"``
(``scripts/gpu_check.sh --rehearse``): the tests' own plumbing checked before a GPU minute is spent on it.

What each asserts: the job completes (exit 0, ``completed``), the rank that trains says it ran on the device in
its file's attributes, its losses are finite, and it made the steps asked for:

* Ape-X, both replay placements; Breakout with the learner's frame cache on the device and bf16 autocast;
  two data-parallel learners sharing the one GPU;
* QMIX; IMPALA with the queue on a buffer rank, and with the inference worker on the learner's rank;
* a3c: the parameter server on the GPU (async, sync; its workers too), and an allreduce in which one rank sees the
  GPU and the others do not (a GPU node among CPU nodes, ``agent.device = "auto"``);
* checkpoints: written on the GPU and resumed on the CPU and back (Ape-X's learner, the a3c server).
* a policy trained on the GPU played (``mpirl play --device``) and exported on either.
"""

from __future__ import annotations

import os
import sys

import h5py
import numpy as np
import pytest

from conftest import JOBS, ROOT, Job, _watched, mpi_command, run_mpi

ON = os.environ.get("MPIRL_CUDA_TESTS_ON", "cuda")


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


pytestmark = [pytest.mark.mpi, pytest.mark.cuda,
              pytest.mark.skipif(ON == "cuda" and not _cuda(), reason="no CUDA device")]

DEVICE = f"agent.device={ON}"
APEX_SHORT = ("run.train_steps=300", "run.target_return=nan", "run.wall_seconds=0", "replay.learning_starts=500")
QMIX_SHORT = ("run.train_steps=24", "run.wall_seconds=0", "env.max_episode_steps=25", "replay.batch_size=8",
              "replay.learning_starts=8", "replay.capacity=40", "qmix.test_every=10", "qmix.test_episodes=4",
              "comm.n_update=2", "log.interval=0.2")
IMPALA_SHORT = ("run.train_steps=150", "run.wall_seconds=0", "run.target_return=nan", "run.env_steps=0")
A3C_SHORT = ("run.train_steps=150", "run.wall_seconds=0", "run.target_return=nan", "run.env_steps=0")


def completed(job: Job, reason: str) -> h5py.File:
    assert job.proc.returncode == 0, job.output[-4000:]
    f = h5py.File(job.run_dir / "run.h5", "r")
    assert f.attrs["status"] == "completed" and f.attrs["stop_reason"] == reason, f.attrs["stop_reason"]
    return f


def on_device(attrs) -> None:
    assert str(attrs["device"]).startswith(ON), dict(attrs)


def finite_losses(table, column: str = "loss") -> None:
    values = table[column][()]
    assert len(values) and np.isfinite(values).any() and not np.isinf(values).any(), values


@pytest.mark.parametrize("architecture", ["proposed", "baseline"])
def test_apex_learner(tmp_path, architecture):
    job = run_mpi(4, tmp_path, *APEX_SHORT, DEVICE, f"replay.architecture={architecture}", timeout=300)
    with completed(job, "train_steps 300 reached") as f:
        on_device(f["learner"].attrs)
        assert f["learner/train/train_steps"][-1] == 300
        finite_losses(f["learner/train"])


def test_apex_breakout_frame_cache_and_bf16_on_the_device(tmp_path):
    """Frames once into the learner's cache on the device, stacks rebuilt there by one gather, bf16 autocast."""
    job = run_mpi(4, tmp_path, "run.train_steps=60", "run.env_steps=0", "run.wall_seconds=0",
                  "replay.learning_starts=600", "replay.capacity=4096", "env.envs_per_actor=2",
                  "replay.frame_cache=8192", 'agent.precision="bf16"', DEVICE,
                  job=JOBS / "breakout_proposed_small.toml", timeout=300)
    with completed(job, "train_steps 60 reached") as f:
        attrs = f["learner"].attrs
        on_device(attrs)
        assert attrs["precision"] == "bf16", dict(attrs)
        t, s = f["learner/train"], f["learner/shards"]
        assert t["train_steps"][-1] == 60
        finite_losses(t)
        hits, misses = int(s["cache_hits"][-1]), int(s["cache_misses"][-1])
        assert hits > 0 and misses > 0, (hits, misses)


def test_apex_two_learners_share_one_gpu(tmp_path):
    job = run_mpi(5, tmp_path, *APEX_SHORT, DEVICE, "topology.learners=2", timeout=300)
    with completed(job, "train_steps 300 reached") as f:
        learners = [k for k in f if k.startswith("learner")]
        assert len(learners) == 2, learners
        for name in learners:
            on_device(f[name].attrs)
            assert f[name]["train/train_steps"][-1] == 300
            finite_losses(f[name]["train"])


def test_qmix_learner(tmp_path):
    job = run_mpi(4, tmp_path, *QMIX_SHORT, DEVICE, job=JOBS / "predator_prey_qmix.toml", timeout=300)
    with completed(job, "train_steps 24 reached") as f:
        on_device(f["learner"].attrs)
        assert f["learner/train/train_steps"][-1] == 24
        finite_losses(f["learner/train"])
        assert np.isfinite(f["learner/test/return_mean"][()]).all()


@pytest.mark.parametrize("n, sets", [(4, ()), (4, ("topology.workers=learner",))],
                         ids=["queue-on-a-buffer", "worker-on-the-learner"])
def test_impala_learner(tmp_path, n, sets):
    job = run_mpi(n, tmp_path, *IMPALA_SHORT, DEVICE, *sets, job=JOBS / "impala_cartpole.toml", timeout=300)
    with completed(job, "train_steps 150 reached") as f:
        on_device(f["learner"].attrs)
        assert f["learner/train/train_steps"][-1] == 150
        finite_losses(f["learner/train"])
        assert np.isfinite(f["learner/test/return_mean"][()]).all()


def _a3c_files(run_dir):
    workers = {int(p.stem.split("_")[1]): p for p in run_dir.glob("worker_*.h5")}
    return run_dir / "updates.h5", workers


@pytest.mark.parametrize("exchange", ["async", "sync"])
def test_a3c_server_and_workers(tmp_path, exchange):
    job = run_mpi(5, tmp_path, *A3C_SHORT, DEVICE, f'a3c.exchange="{exchange}"', job=JOBS / "a3c_cartpole.toml",
                  timeout=300)
    with completed(job, "train_steps 150 reached"):
        pass
    updates, workers = _a3c_files(job.run_dir)
    with h5py.File(updates, "r") as u:
        on_device(u.attrs)
        assert u["updates/version"][-1] == 150
        finite_losses(u["updates"])
    assert len(workers) == 4
    for path in workers.values():
        with h5py.File(path, "r") as w:
            on_device(w.attrs)


def test_a3c_allreduce_with_one_rank_on_the_gpu(tmp_path):
    """A GPU node among CPU nodes: rank 0 sees the GPU, ranks 1-3 see none (``CUDA_VISIBLE_DEVICES`` empty), and
    ``agent.device = "auto"`` puts each on what its node has; the allreduce's sums meet on the host. Devices of two
    kinds round the same update differently: every ``a3c.check_every`` updates rank 0's parameters are
    broadcast (a drift beyond rounding fails the job) instead of the hash check."""
    cmd = mpi_command(4, tmp_path, *A3C_SHORT, "agent.device=auto", 'a3c.exchange="allreduce"',
                      job=JOBS / "a3c_cartpole.toml")
    at = cmd.index(sys.executable)
    hide = 'if [ "${OMPI_COMM_WORLD_RANK:-0}" != 0 ]; then export CUDA_VISIBLE_DEVICES=; fi; exec "$@"'
    cmd[at:at] = ["/bin/sh", "-c", hide, "sh"]
    job = Job(_watched(cmd, tmp_path, 300, 900), tmp_path)
    with completed(job, "train_steps 150 reached"):
        pass
    updates, workers = _a3c_files(job.run_dir)
    with h5py.File(updates, "r") as u:
        on_device(u.attrs)
        assert u.attrs["devices"] == f"{ON},cpu,cpu,cpu", u.attrs["devices"]  # re-synced, not compared by hash
        assert u["updates/version"][-1] == 150
        finite_losses(u["updates"])
    devices = {}
    for rank, path in workers.items():
        with h5py.File(path, "r") as w:
            devices[rank] = str(w.attrs["device"])
            assert int(w.attrs["version"]) == 150  # every rank made every update
    assert devices[0].startswith(ON) and all(devices[r] == "cpu" for r in (1, 2, 3)), devices


@pytest.mark.parametrize("job_file, n, step_table", [("cartpole.toml", 4, "learner"),
                                                     ("a3c_cartpole.toml", 5, "updates")],
                         ids=["apex-learner", "a3c-server"])
def test_a_checkpoint_moves_between_gpu_and_cpu(tmp_path, job_file, n, step_table):
    """Trained on the device, resumed on the CPU, resumed on the device again: each leg continues the one before
    (its steps one axis), whatever device wrote the checkpoint."""
    out = tmp_path / "runs"
    base = ("run.target_return=nan", "run.wall_seconds=0", "run.env_steps=0", "replay.learning_starts=500")
    if job_file.startswith("a3c"):
        base = base[:-1]
    run_dir = None
    for leg, (device, steps) in enumerate([(ON, 100), ("cpu", 200), (ON, 300)]):
        args = () if run_dir is None else ("--resume", str(run_dir))
        job = run_mpi(n, out, *base, f"run.train_steps={steps}", f"agent.device={device}", job=JOBS / job_file,
                      args=args, timeout=300)
        with completed(job, f"train_steps {steps} reached") as f:
            run_dir = job.run_dir
            if step_table == "learner":
                on = f["learner"].attrs["device"]
                rows = f["learner/train/train_steps"][()]
            else:
                rows = None
        if step_table == "updates":
            with h5py.File(run_dir / "updates.h5", "r") as u:
                on, rows = u.attrs["device"], u["updates/version"][()]
        assert str(on).startswith(device), (leg, on)
        assert rows[-1] == steps and np.all(np.diff(rows) >= 0), (leg, rows)
    assert len(list(out.glob("*/run.h5"))) == 1  # one run, resumed twice


def test_a_policy_trained_on_the_gpu_plays_and_exports_on_either(tmp_path):
    """The checkpoint of a learner on the device loads on the device and on the CPU (mpirl play --device, mpirl.
    load_policy): the same greedy actions on observations of played episodes, and the export (always on the CPU)
    is checked against the policy before it is written."""
    import mpirl
    from mpirl.cli import main
    from mpirl.trained.export import observations
    job = run_mpi(4, tmp_path, *APEX_SHORT, DEVICE, timeout=300)
    completed(job, "train_steps 300 reached").close()
    cpu, dev = mpirl.load_policy(job.run_dir), mpirl.load_policy(job.run_dir, device=ON)
    obs = np.stack(observations(cpu, 500, seed=1)[0])
    same = np.mean(cpu.act(obs)[0] == dev.act(obs)[0])
    assert same >= 0.99, same  # float sums differ across devices: a near tie may break the other way
    assert main(["play", str(job.run_dir), "--episodes", "2", "--device", ON]) == 0
    assert main(["export", str(job.run_dir), "--out", str(tmp_path / "p.pt")]) == 0
