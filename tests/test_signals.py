"""A stop signal on any one rank stops the whole job the clean way, in every algorithm and exchange.

SIGUSR1 (or SIGTERM) goes to one non-zero rank alone (a second learner, a buffer, a queue, an inference worker, an
actor, a gradient worker, a DistQL worker; as a batch system that drains one node does): the job ends with exit 75,
``run.h5`` says ``preempted`` and names that rank and its role, a checkpoint was written at the stop, and
``--resume`` continues the same run. Each algorithm's chain signals one role per leg, each leg resuming the one
before, and a last leg runs to its stop condition: one run, resumed once per role.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import h5py
import pytest

from mpirl.job import checkpoint

from conftest import JOBS, finish, ranks_of, run_mpi, start_mpi, wait_for
from mpirl.bench.run_mpi import train_steps
from test_a3c import version_of

pytestmark = pytest.mark.mpi


def _checkpoints(out: Path) -> int:
    return sum(len(checkpoint.checkpoints(run)) for run in Path(out).glob("*/"))


def _newest_step(run_dir: Path) -> int:
    return int(checkpoint.checkpoints(run_dir)[-1].name[5:15])


def _chain(tmp_path, n: int, job: Path, sets: tuple, legs: list[tuple], progress, steps_key: str,
           last: dict | None = None) -> Path:
    """One run signalled leg after leg: leg i waits until ``progress(out)`` moved on from where the previous leg
    left it, sends ``legs[i][2]`` (default SIGUSR1) to rank ``legs[i][0]`` alone and expects exit 75, ``preempted``
    naming that signal, rank and role (``legs[i][1]``) and a new checkpoint; the next leg resumes it. A last leg,
    resumed, runs to its stop."""
    out = tmp_path / "runs"
    run_dir, before, saved = None, 0, 0
    for rank, role, *how in legs:
        signum = how[0] if how else signal.SIGUSR1
        args = () if run_dir is None else ("--resume", str(run_dir))
        with start_mpi(n, out, f"{steps_key}=100000000", *sets, job=job, args=args) as running:
            wait_for(running, lambda: progress(out) >= before + 5, f"5 more steps than {before}")
            pids = ranks_of(running.pid)
            assert len(pids) == n, pids
            os.kill(pids[rank], signum)
            code, text = finish(running, 120)
        run_dir = next(out.glob("*/run.h5")).parent
        name = signal.Signals(signum).name
        assert code == 75, f"{name} to rank {rank} ({role}): exit {code}\n{text[-3000:]}"
        with h5py.File(run_dir / "run.h5", "r") as f:
            assert f.attrs["status"] == "preempted", f.attrs["status"]
            assert f.attrs["stop_reason"] == f"preempted: {name} on rank {rank} ({role})", f.attrs["stop_reason"]
        assert checkpoint.checkpoints(run_dir), f"no checkpoint after SIGUSR1 to rank {rank}"
        assert _newest_step(run_dir) > saved, (saved, checkpoint.checkpoints(run_dir))  # written at this stop
        saved = _newest_step(run_dir)
        before = progress(out)
    final = last(run_dir) if last else {steps_key: saved + 5}
    budget = {steps_key: 100000000, **final}
    done = run_mpi(n, out, *sets, *[f"{k}={v}" for k, v in budget.items()], job=job, args=("--resume", str(run_dir)))
    assert done.proc.returncode == 0, done.output[-3000:]
    assert len(list(out.glob("*/run.h5"))) == 1  # one run, resumed leg after leg
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed", f.attrs["stop_reason"]
        assert f.attrs["restarts"] == len(legs)
        reason = f.attrs["stop_reason"]
    key, value = next(iter(final.items()))
    assert reason == f"{key.split('.')[1]} {value} reached", reason
    return run_dir


REPLAY = ("run.target_return=nan", "run.env_steps=0", "run.wall_seconds=0", "replay.learning_starts=300",
          "log.interval=0.2", "log.flush_seconds=0.2")


def test_apex_a_second_learner_a_buffer_and_an_actor(tmp_path):
    """Ranks: 0-1 learners, 2 buffer, 3-4 actors."""
    _chain(tmp_path, 5, JOBS / "cartpole.toml", (*REPLAY, "topology.learners=2"),
           [(1, "learner"), (2, "buffer"), (4, "actor", signal.SIGTERM)], train_steps, "run.train_steps")


def test_qmix_a_buffer_and_an_actor(tmp_path):
    """Ranks: 0 learner, 1 buffer, 2-3 actors."""
    sets = ("run.wall_seconds=0", "env.max_episode_steps=25", "replay.batch_size=8", "replay.learning_starts=8",
            "replay.capacity=40", "qmix.test_every=1000000", "qmix.test_episodes=1", "comm.n_update=2", "log.interval=0.2",
            "log.flush_seconds=0.2")
    _chain(tmp_path, 4, JOBS / "predator_prey_qmix.toml", sets, [(1, "buffer"), (3, "actor")], train_steps,
           "run.train_steps")


def test_impala_a_queue_an_inference_worker_and_an_actor(tmp_path):
    """Ranks: 0 learner, 1 buffer (the queue), 2 inference worker, 3-4 actors."""
    sets = ("run.target_return=nan", "run.env_steps=0", "run.wall_seconds=0", "topology.workers=1",
            "log.interval=0.2", "log.flush_seconds=0.2")
    _chain(tmp_path, 5, JOBS / "impala_cartpole.toml", sets, [(1, "buffer"), (2, "worker"), (4, "actor")],
           train_steps, "run.train_steps")


@pytest.mark.parametrize("exchange, n, rank, signum", [("async", 3, 2, signal.SIGTERM), ("sync", 3, 2, signal.SIGUSR1),
                                                       ("allreduce", 3, 2, signal.SIGUSR1)])
def test_a3c_a_worker(tmp_path, exchange, n, rank, signum):
    """A gradient worker alone: async and sync (rank 0 the server, two workers), allreduce (rank 0 worker 0, which
    decides, of three). (Three ranks, not four or five: each rank's torch start-up, twice a test, is most of what it
    costs.)"""
    sets = ("run.target_return=nan", "run.env_steps=0", "run.wall_seconds=0", f'a3c.exchange="{exchange}"',
            "log.flush_seconds=0.2")
    _chain(tmp_path, n, JOBS / "a3c_cartpole.toml", sets, [(rank, "worker", signum)], version_of, "run.train_steps")


def _distql_env_steps(run_dir: Path) -> dict:
    with h5py.File(checkpoint.checkpoints(run_dir)[-1], "r") as f:
        steps = sum(int(f[f"workers/{w}"].attrs["env_steps"]) for w in (1, 2))
    return {"run.env_steps": steps + 20_000}


def test_distql_a_worker(tmp_path):
    """Ranks: 0 the Q-server, 1-2 workers; the checkpoint is the server's and its workers' cut."""
    sets = ("distql.workers=2", "log.flush_seconds=0.2", "distql.eval_episodes=0", "checkpoint.every_seconds=0.5")
    _chain(tmp_path, 3, JOBS / "taxi_distql.toml", sets, [(2, "worker")], lambda out: 5 * _checkpoints(out),
           "distql.episodes", last=_distql_env_steps)
