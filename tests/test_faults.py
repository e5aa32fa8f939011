"""Faults a job survives or reports: a game that raises, a diverging learner, a rank that dies."""

import os
import signal

import h5py
import numpy as np
import pytest
import torch

from mpirl.agents.dqn import DQNLearner
from mpirl.config import AgentConfig
from mpirl.job import checkpoint

from conftest import finish, ranks_of, run_mpi, start_mpi, train_steps, wait_for

SHORT = ("run.train_steps=800", "run.target_return=nan", "run.env_steps=0", "replay.learning_starts=300")


def _batch(n=8, seed=0):
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((n, 4)).astype(np.float32), "action": rng.integers(0, 2, n),
            "reward": np.ones(n, np.float32), "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
            "done": np.zeros(n, bool), "discount": np.full(n, 0.97, np.float32)}


def test_a_non_finite_batch_is_skipped_and_leaves_the_weights_alone():
    agent = DQNLearner((4,), 2, AgentConfig(), torch.device("cpu"))
    batch = _batch()
    before = agent.flat_params().copy()
    batch["reward"][3] = np.nan
    loss, td = agent.train_step(batch, np.ones(8, np.float32))
    assert td is None and not np.isfinite(loss) and agent.steps == 0
    assert agent.fault.kind == "batch" and agent.fault.detail == "1 of the batch's 8 reward values were not finite"
    np.testing.assert_array_equal(agent.flat_params(), before)
    batch["reward"][3] = 1.0
    loss, td = agent.train_step(batch, np.ones(8, np.float32))
    assert td is not None and np.isfinite(loss) and agent.steps == 1
    with torch.no_grad():
        next(agent.online.parameters())[0, 0] = float("inf")
    assert agent.train_step(batch, np.ones(8, np.float32))[1] is None
    assert agent.fault.kind == "parameters"
    assert agent.fault.detail == "the online network's parameters were not finite (torso.0.weight)"


def test_a_skipped_batch_names_what_was_not_finite():
    """Not always the learning rate: a loss that overflows on huge rewards, the gradient of the one layer whose
    gradient is not finite (before clipping, which spreads a NaN norm to every layer), Q-values of huge weights."""
    agent = DQNLearner((4,), 2, AgentConfig(), torch.device("cpu"))
    w = np.ones(64, np.float32)
    huge = _batch(64)
    huge["reward"][:] = 1e38  # finite, but 64 of them overflow the mean
    assert agent.train_step(huge, w)[1] is None
    assert agent.fault.kind == "loss" and agent.fault.detail.startswith("the loss was inf though its inputs were finite")

    layer = dict(agent.online.named_parameters())["head.value.0.weight"]
    hook = layer.register_hook(lambda g: torch.full_like(g, float("nan")))
    assert agent.train_step(_batch(64), w)[1] is None
    hook.remove()
    assert agent.fault.kind == "gradient"
    assert agent.fault.detail.startswith("the gradient norm of head.value.0.weight (nan) was not finite"), agent.fault
    hook = layer.register_hook(lambda g: g * 1e30)  # finite, but its square overflows the norm
    assert agent.train_step(_batch(64), w)[1] is None
    hook.remove()
    assert agent.fault.kind == "gradient"
    assert agent.fault.detail.startswith("the gradient norm of head.value.0.weight (inf) was not finite"), agent.fault
    assert agent.steps == 0 and agent.train_step(_batch(64), w)[1] is not None  # the hooks gone, the batch trains

    big = DQNLearner((4,), 2, AgentConfig(lr=1e30), torch.device("cpu"))
    assert big.train_step(_batch(64), w)[1] is not None  # the step itself is finite; the weights it leaves are not
    assert big.train_step(_batch(64, seed=1), w)[1] is None
    assert big.fault.kind == "q" and big.fault.detail.startswith("64 of the online network's 64 Q-values were not "
                                                                 "finite (its parameters are finite, up to 1e+30 in ")


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
    assert "the learner has diverged: 100 batches in a row were not finite after train step" in job.output, \
        job.output[-3000:]
    assert "Q-values were not finite (its parameters are finite, up to 1e+30 in " in job.output, job.output[-3000:]
    assert "the settings that feed it: agent.lr=1e+30, agent.grad_clip=1e+38, agent.adam_eps=1e-08" in job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "failed"
        assert f.attrs["stop_reason"].startswith("failed on rank 0 (learner): FloatingPointError: ")
        assert (f.attrs["failed_rank"], f.attrs["failed_role"]) == (0, "learner")


@pytest.mark.mpi
def test_a_loss_that_overflows_is_blamed_on_the_rewards_not_the_learning_rate(tmp_path):
    job = run_mpi(4, tmp_path, "run.train_steps=20000", "run.target_return=nan", "run.env_steps=0",
                  "replay.learning_starts=300", "env.id=tests.faulty_env:HugeRewardCartPole-v0", timeout=180)
    assert job.proc.returncode != 0
    assert "in the last, the loss was inf though its inputs were finite (|TD| up to 2.9" in job.output, \
        job.output[-3000:]
    assert ("the settings that feed it: agent.reward_clip=0, env.id=tests.faulty_env:HugeRewardCartPole-v0, "
            "agent.lr=0.001, agent.grad_clip=10") in job.output, job.output[-3000:]


@pytest.mark.mpi
def test_a_rank_that_dies_ends_the_job_and_resume_recovers(tmp_path):
    out = tmp_path / "runs"
    sets = ("run.target_return=nan", "run.env_steps=0", "run.wall_seconds=0",
            "replay.learning_starts=300", "checkpoint.every_steps=700", "log.interval=0.2", "log.flush_seconds=0.2")
    # The first run's budget is never reached: it ends when its learner is killed, however fast this machine is.
    killed = None

    def kill_the_learner_between_a_checkpoint_and_its_next_rows() -> bool:
        nonlocal killed
        if train_steps(out) < 1000:
            return False
        # The learner held still while its files are read: the newest checkpoint and the rows after it
        # are what the kill leaves behind.
        learner = ranks_of(job.pid)[0]
        os.kill(learner, signal.SIGSTOP)
        run_dir = next(out.glob("*/run.h5")).parent
        newest = checkpoint.checkpoints(run_dir)
        try:
            with h5py.File(run_dir / "learner.h5", "r", locking=False) as f:
                rows = int(f["batches/train_step"][-1])
        except (OSError, KeyError, IndexError):
            rows = 0
        if newest and rows > int(newest[-1].name[5:15]):
            # The learner dies (no chance to checkpoint): the newest checkpoint is a periodic one, and the
            # metrics rows written after it must be dropped on resume.
            os.kill(learner, signal.SIGKILL)
            killed = rows
            return True
        os.kill(learner, signal.SIGCONT)  # caught between a checkpoint and its next rows: let it write them
        return False
    with start_mpi(4, out, "run.train_steps=100000", *sets) as job:  # leaving it: nothing of the job is left
        wait_for(job, kill_the_learner_between_a_checkpoint_and_its_next_rows, "1000 train steps and the kill")
        code, text = finish(job, 120)  # the job ends: never a hang
    assert code != 0
    assert "ranks: 0 learner; 1 buffer, 2-3 actors of buffer 1" in text
    assert "rank 0" in text and "signal 9" in text, text[-3000:]
    run_dir = next(out.glob("*/run.h5")).parent
    last = checkpoint.checkpoints(run_dir)[-1]
    done = int(last.name[5:15])
    # A periodic checkpoint (700 when the kill came soon after step 1000), rows after it
    assert done % 700 == 0 and 700 <= done < killed, (last, killed)
    with h5py.File(run_dir / "learner.h5", "r") as f:
        assert f["batches/train_step"][-1] > done  # rows after the checkpoint, to be dropped

    steps = done + 1000  # past every row the kill left (it came before the next checkpoint, done + 700)
    job = run_mpi(4, out, f"run.train_steps={steps}", *sets, args=("--resume", str(run_dir)))
    assert job.proc.returncode == 0, job.output
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed"
        # rows written between the last checkpoint and the crash were dropped and done again: one axis
        np.testing.assert_array_equal(f["learner/batches/train_step"][()], np.arange(1, steps + 1))
        t = f["learner/train/time"][()]
        assert np.all(np.diff(t) >= 0) and np.all(np.diff(f["learner/train/train_steps"][()]) >= 0)
        episodes_t = f["buffer_1/episodes/time"][()]
        assert np.all(np.diff(episodes_t) >= 0)
