"""ALE at 84x84 with 4-frame stacks through every role of IMPALA and PPO: the Pong job files, shrunk to a few train
steps, exit 0, train on uint8 frames, record when their games began, and give `mpirl bench atari` its counts."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest

from conftest import JOBS, run_mpi
from mpirl import config
from mpirl.bench import atari

pytest.importorskip("ale_py")

FRAME_BYTES = 84 * 84  # one grey 84x84 frame, uint8


@pytest.mark.parametrize("name", ["impala_pong", "impala_breakout", "ppo_pong", "ppo_breakout"])
def test_the_atari_job_files_load_with_the_nature_network_on_uint8_stacks(name):
    from mpirl.envs.factory import env_spaces
    cfg, _ = config.load(JOBS / f"{name}.toml", [])
    assert cfg.agent.network == "nature" and cfg.agent.reward_clip == 1.0
    assert env_spaces(cfg.env)[:2] == ((4, 84, 84), np.dtype(np.uint8))


@pytest.mark.mpi
def test_impala_on_pong_runs_every_role_and_trains_on_uint8_trajectories(tmp_path):
    """Learner, trajectory queue and 2 actors on ALE Pong: 3 train steps of 4 trajectories, exit 0."""
    job = run_mpi(4, tmp_path, "run.wall_seconds=0", "run.train_steps=3", "env.envs_per_actor=2", "replay.batch_size=4", "replay.capacity=8",
                  "impala.test_episodes=1", "env.max_episode_steps=200", "agent.torch_threads=1",
                  job=JOBS / "impala_pong.toml", timeout=300)
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "learner.h5", "r") as f:
        t = f["train"]
        assert int(t["train_steps"][-1]) == 3 and int(t["samples_trained"][-1]) == 12
        assert np.isfinite(t["loss"][()]).all()
        # the bytes the learner received per trajectory trained: 21 uint8 stacks of 4 frames each and little else,
        # times (batches received / trained: up to 5/3 with the batches prefetched); float32 stacks would be 4x
        per_trajectory = float(f.attrs["bytes_in_raw"]) / int(t["samples_trained"][-1])
        assert 21 * 4 * FRAME_BYTES <= per_trajectory < 2.5 * 21 * 4 * FRAME_BYTES
        assert f["test/episodes"][-1] == 1
    with h5py.File(job.run_dir / "buffer_1.h5", "r") as f:
        started = f["actors/started_s"][()]
        assert set(f["actors/actor"][()]) == {2, 3} and np.isfinite(started).all() and (started > 0).all()
        assert f["actors/torch_imported"][()].all()  # IMPALA's actors play with torch's network (the column tells)
    counts = atari.impala_counts(job.run_dir, wall=math.inf)
    assert counts["env_steps_trained"] == 12 * 20 and counts["env_steps_sampled"] >= 12 * 20
    assert counts["seconds"] > 0 and 0 < counts["learner_busy"] <= 1


@pytest.mark.mpi
def test_ppo_on_pong_runs_every_worker_and_trains_every_pass(tmp_path):
    """DD-PPO's allreduce on ALE Pong, 2 workers of 2 games: 8 updates (2 rollouts of 2 epochs x 2 minibatches),
    exit 0; every gradient's minibatch counted."""
    job = run_mpi(2, tmp_path, "run.wall_seconds=0", "run.train_steps=8", "env.envs_per_actor=2", "a3c.unroll=16",
                  "a3c.epochs=2", "a3c.minibatches=2", "a3c.test_episodes=1", "env.max_episode_steps=200",
                  job=JOBS / "ppo_pong.toml", timeout=300)
    assert job.proc.returncode == 0, job.output
    counts = atari.ppo_counts(job.run_dir, wall=math.inf)
    # 2 workers x 8 gradients x minibatches of 16 steps x 2 games / 2
    assert counts["env_steps_trained"] == 2 * 8 * 16 and counts["env_steps_sampled"] == 2 * 2 * 16 * 2
    assert counts["seconds"] > 0 and 0 < counts["learner_busy"] <= 1
    for w in (0, 1):
        with h5py.File(job.run_dir / f"worker_{w}.h5", "r") as f:
            assert f.attrs["version"] == 8 and f.attrs["started_s"] > 0
            assert np.isfinite(f["rollouts/compute_s"][()]).all()


@pytest.mark.mpi
def test_ppo_on_pong_normalises_its_frames_pixel_by_pixel_and_the_trained_policy_takes_raw_frames(tmp_path):
    """``agent.normalize_obs`` on uint8 stacks (Sample Factory's Atari default): 2 workers of 2 games, two
    rollouts of 16 steps each (2 epochs of one gradient: 4 updates), exit 0. The job's statistics are per pixel of
    the scaled stack, every stack the workers acted on counted once (2 workers x 2 rollouts x 16 steps x 2 games),
    the moving pixels with more spread than the background's; the trained
    policy outside the job takes raw uint8 frames, its module holding the statistics in raw pixels."""
    import mpirl
    from mpirl.job import checkpoint
    job = run_mpi(2, tmp_path, "run.wall_seconds=0", "run.train_steps=4", "env.envs_per_actor=2", "a3c.unroll=16",
                  "a3c.epochs=2", "a3c.minibatches=1", "a3c.test_episodes=1", "env.max_episode_steps=200",
                  "agent.normalize_obs=true", "agent.normalized_obs_clip=5", job=JOBS / "ppo_pong.toml", timeout=300)
    assert job.proc.returncode == 0, job.output
    st = checkpoint.load(checkpoint.checkpoints(job.run_dir)[-1])["model"]["normalization"]["obs"]
    count, mean, var = float(st["count"]), np.asarray(st["mean"]), np.asarray(st["var"])
    assert count == 2 * 2 * 16 * 2 and mean.shape == var.shape == (4 * 84 * 84,), (count, mean.shape)
    assert 0 <= mean.min() and mean.max() <= 1 and var.max() <= 0.25  # pixels / 255: in [0, 1]
    # Pong's background is still (its spread is the stacks' zero frames at a game's start); the paddles move
    assert var.max() > 3 * np.median(var), np.quantile(var, [0, 0.5, 0.9, 0.99, 1])
    policy = mpirl.load_policy(job.run_dir)
    frames = np.zeros((3, 4, 84, 84), np.uint8)
    actions = policy.act(frames)[0]
    assert actions.shape == (3,) and set(actions.tolist()) <= set(range(6))
