"""Faults a job survives or reports: a game that raises, a diverging learner, a rank that dies."""

import os
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest
import torch

from mpirl.agents.dqn import DQNLearner
from mpirl.config import AgentConfig
from mpirl.roles import checkpoint

from conftest import ROOT, mpi_command, mpi_env, ranks_of, run_mpi, train_steps_so_far

SHORT = ("run.train_steps=800", "run.target_return=nan", "run.env_steps=0", "replay.learning_starts=300")


def test_a_non_finite_batch_is_skipped_and_leaves_the_weights_alone():
    agent = DQNLearner((4,), 2, AgentConfig(), torch.device("cpu"))
    rng = np.random.default_rng(0)
    batch = {"obs": rng.standard_normal((8, 4)).astype(np.float32), "action": rng.integers(0, 2, 8),
             "reward": np.ones(8, np.float32), "next_obs": rng.standard_normal((8, 4)).astype(np.float32),
             "done": np.zeros(8, bool), "discount": np.full(8, 0.97, np.float32)}
    before = agent.flat_params().copy()
    batch["reward"][3] = np.nan
    loss, td = agent.train_step(batch, np.ones(8, np.float32))
    assert td is None and not np.isfinite(loss) and agent.steps == 0
    assert agent.skip_reason == "the batch's reward (from the environment)"
    np.testing.assert_array_equal(agent.flat_params(), before)
    batch["reward"][3] = 1.0
    loss, td = agent.train_step(batch, np.ones(8, np.float32))
    assert td is not None and np.isfinite(loss) and agent.steps == 1
    with torch.no_grad():
        next(agent.online.parameters())[0, 0] = float("inf")
    assert agent.train_step(batch, np.ones(8, np.float32))[1] is None
    assert agent.skip_reason.startswith("the online network's parameters (")


@pytest.mark.mpi
def test_an_environment_that_raises_is_rebuilt_and_counted(tmp_path):
    job = run_mpi(4, tmp_path, *SHORT, "env.id=tests.faulty_env:FlakyCartPole-v0")
    assert job.proc.returncode == 0, job.output
    assert "raised ValueError: injected flaky failure in env.step; rebuilding its environments" in job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed"
        actors = f["buffer_1/actors"]
        for a in (2, 3):  # every 400th call to step raised, the actor rebuilt its game and went on
            rows = actors["actor"][()] == a
            steps, errors = actors["env_steps"][()][rows].max(), actors["env_errors"][()][rows].max()
            assert errors >= steps // 400 - 1 and (steps < 400 or errors >= 1), (a, steps, errors)
        assert actors["env_errors"][()].max() >= 1
        assert f["learner/train/train_steps"][-1] == 800


@pytest.mark.mpi
def test_a_diverging_learner_ends_the_job_with_a_clear_message(tmp_path):
    job = run_mpi(4, tmp_path, "run.train_steps=20000", "run.target_return=nan", "run.env_steps=0",
                  "replay.learning_starts=300", "agent.lr=1e30", "agent.grad_clip=1e38", timeout=180)
    assert job.proc.returncode != 0
    assert "batches in a row were not finite after train step" in job.output, job.output[-3000:]
    assert ("the learner has diverged; the settings that feed it: agent.lr = 1e+30, agent.grad_clip = 1e+38"
            in job.output), job.output[-3000:]
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "failed"
        assert f.attrs["stop_reason"].startswith("failed on rank 0 (learner): FloatingPointError: ")
        assert (f.attrs["failed_rank"], f.attrs["failed_role"]) == (0, "learner")


@pytest.mark.mpi
def test_a_rank_that_dies_ends_the_job_and_resume_recovers(tmp_path):
    out = tmp_path / "runs"
    sets = ("run.train_steps=2500", "run.target_return=nan", "run.env_steps=0", "run.wall_seconds=0",
            "replay.learning_starts=300", "checkpoint.every_steps=700", "log.interval=0.2", "log.flush_seconds=0.2")
    cmd = mpi_command(4, out, *sets)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=mpi_env(),
                            cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while train_steps_so_far(out) < 1000 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert train_steps_so_far(out) >= 1000, "the job did not train 1000 steps within 120 s"
        # The learner dies (no chance to checkpoint): the newest checkpoint is a periodic one, and the
        # metrics rows written after it must be dropped on resume.
        os.kill(ranks_of(proc.pid)[0], signal.SIGKILL)
        text, _ = proc.communicate(timeout=60)  # the job ends: never a hang
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "ranks: 0 learner; 1 buffer, 2-3 actors of buffer 1" in text
    assert "rank 0" in text and "signal 9" in text, text[-3000:]
    run_dir = next(out.glob("*/run.h5")).parent
    last = checkpoint.checkpoints(run_dir)[-1]
    done = int(last.name[5:15])
    assert done == 700, last  # killed after step 1000, before the checkpoint at 1400
    with h5py.File(run_dir / "learner.h5", "r") as f:
        assert f["batches/train_step"][-1] > done  # rows after the checkpoint, to be dropped

    job = run_mpi(4, out, *sets, args=("--resume", str(run_dir)))
    assert job.proc.returncode == 0, job.output
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed"
        # rows written between the last checkpoint and the crash were dropped and done again: one axis
        np.testing.assert_array_equal(f["learner/batches/train_step"][()], np.arange(1, 2501))
        t = f["learner/train/time"][()]
        assert np.all(np.diff(t) >= 0) and np.all(np.diff(f["learner/train/train_steps"][()]) >= 0)
        episodes_t = f["buffer_1/episodes/time"][()]
        assert np.all(np.diff(episodes_t) >= 0)
