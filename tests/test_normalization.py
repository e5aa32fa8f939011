"""Running statistics of observations and returns through whole jobs: the gradient family's (merged by the server
and by the allreduce, checkpointed, surviving kill -9 and --resume, identical on every allreduce rank on MuJoCo's
Hopper) and IMPALA's learner's (every trained step counted once)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from conftest import JOBS, run_mpi


def _stats(ckpt_path) -> dict:
    from mpirl.job import checkpoint
    st = checkpoint.load(ckpt_path)
    st = st["model"]["normalization"] if "model" in st else st["normalization"]  # the gradient family's, IMPALA's
    return {k: {kk: np.asarray(vv) for kk, vv in v.items()} for k, v in st.items()}


@pytest.mark.mpi
def test_normalisation_statistics_are_the_jobs_and_survive_kill_9_and_resume(tmp_path):
    """Pendulum with observations and rewards normalised (a server and 2 workers): the checkpoint holds the job's
    statistics -- every observation the workers acted on counted once (up to the rollouts still in flight), the
    means of Pendulum's cos, sin and angular velocity -- kill -9 of a worker ends the job, and --resume goes on
    from the checkpoint's statistics: the count keeps growing from there instead of starting over."""
    import os
    import signal

    from conftest import finish, ranks_of, start_mpi, wait_for
    from mpirl.job import checkpoint
    from test_a3c import version_of
    out = tmp_path / "runs"
    sets = ("run.target_return=nan", "run.wall_seconds=0", "run.env_steps=0", "checkpoint.every_steps=40",
            "log.flush_seconds=0.2", 'a3c.exchange="async"', "a3c.workers=2", "a3c.unroll=64",
            'a3c.loss="a2c"', "a3c.epochs=1", "a3c.minibatches=1", "agent.normalize_obs=true",
            "agent.normalize_reward=true")
    with start_mpi(3, out, "run.train_steps=1000000", *sets, job=JOBS / "pendulum_ppo.toml") as job:
        wait_for(job, lambda: version_of(out) >= 100, "100 updates (checkpoints every 40)")
        os.kill(ranks_of(job.pid)[2], signal.SIGKILL)
        code, text = finish(job, 120)
    assert code != 0 and "signal 9" in text, text[-3000:]
    run_dir = next(out.glob("*/run.h5")).parent
    last = checkpoint.checkpoints(run_dir)[-1]
    done = int(last.name[5:15])
    st = _stats(last)
    # each update is one rollout of 64 steps x 4 games from one worker; the rollouts in flight are not counted yet
    assert done * 256 - 2 * 256 <= st["obs"]["count"] <= done * 256 + 2 * 256, (st["obs"]["count"], done)
    assert st["ret"]["count"] == st["obs"]["count"]
    mean, var = st["obs"]["mean"], st["obs"]["var"]
    assert -1 <= mean[0] <= 1 and -1 <= mean[1] <= 1 and np.all(var > 0) and var[2] > 1, (mean, var)
    assert st["ret"]["var"][0] > 0
    job = run_mpi(3, out, f"run.train_steps={done + 20}", *sets, job=JOBS / "pendulum_ppo.toml",
                  args=("--resume", str(run_dir)))
    assert job.proc.returncode == 0, job.output
    final = _stats(checkpoint.checkpoints(run_dir)[-1])
    grown = final["obs"]["count"] - st["obs"]["count"]
    assert 0 < grown <= 22 * 256, (final["obs"]["count"], st["obs"]["count"])  # on from the checkpoint's
    # The trained policy outside the job normalises with the checkpoint's statistics, inside its exported module too.
    import torch

    import mpirl
    from mpirl.trained.export import export
    policy = mpirl.load_policy(run_dir)
    assert np.allclose(policy.actions.normalize.mean.numpy(), final["obs"]["mean"])
    said = export(policy, tmp_path / "p.pt")
    assert "the same actions as the policy" in said[0]
    module = torch.jit.load(str(tmp_path / "p.pt"))
    x = np.array([[1.0, 0.0, 3.0]], np.float32)
    assert np.allclose(module(torch.as_tensor(x)).numpy(), policy.act(x)[0], atol=1e-6)


@pytest.mark.mpi
def test_impalas_learner_counts_every_trained_step_once_into_the_statistics_it_ships(tmp_path):
    """IMPALA's learner owns the statistics: 40 batches of 32 trajectories of 20 steps are exactly 25,600
    observations and returns counted (the actors' bootstrap observation is the next trajectory's first, counted
    there), checkpointed; the trained policy plays its test round on observations normalised the same way."""
    from mpirl.job import checkpoint
    job = run_mpi(4, tmp_path, "run.train_steps=40", "run.target_return=nan", "run.wall_seconds=0",
                  "run.env_steps=0", "agent.normalize_obs=true", "agent.normalize_reward=true",
                  job=JOBS / "impala_pendulum.toml", timeout=600)
    assert job.proc.returncode == 0, job.output
    st = _stats(checkpoint.checkpoints(job.run_dir)[-1])
    assert st["obs"]["count"] == 40 * 32 * 20 and st["ret"]["count"] == 40 * 32 * 20, st
    assert np.all(np.abs(st["obs"]["mean"][:2]) <= 1) and st["obs"]["var"][2] > 1 and st["ret"]["var"][0] > 0
    with h5py.File(job.run_dir / "learner.h5", "r") as f:
        assert f["test"]["episodes"][-1] == 10


@pytest.mark.mpi
def test_ppo_plays_mujocos_hopper_with_the_jobs_statistics_shared_by_its_allreduce_ranks(tmp_path):
    """jobs/ppo_hopper.toml for 4 rounds (2 workers x 256 steps each): every observation counted once into the
    statistics both ranks hold (their parameter hashes, statistics included, agree), and the final test round plays
    the Gaussian's means on normalised observations."""
    from mpirl.job import checkpoint
    job = run_mpi(2, tmp_path, "run.env_steps=2048", "a3c.test_episodes=2", "a3c.check_every=5",
                  job=JOBS / "ppo_hopper.toml", timeout=600)
    assert job.proc.returncode == 0, job.output
    st = _stats(checkpoint.checkpoints(job.run_dir)[-1])
    assert st["obs"]["count"] == 2048 and st["ret"]["count"] == 2048 and st["obs"]["mean"].shape == (11,)
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        test = {k: f["updates/test"][k][()] for k in f["updates/test"]}
        crcs = {f[name].attrs["params_crc32"] for name in f if name.startswith("worker_")}
    assert test["episodes"].tolist() == [2] and np.isfinite(test["return_mean"][0])
    assert len(crcs) == 1
