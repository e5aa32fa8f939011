"""Checkpoints, preemption and resume.

Without MPI: the checkpoint files (atomic, newest K kept) and every refusal of a
run that cannot be resumed. Under mpiexec: a job preempted by a signal stops
cleanly with a checkpoint, and its resumed run completes with metrics that
continue without a duplicated or missing train step.
"""

import signal

import h5py
import numpy as np
import pytest
import torch

from mpirl.config import load
from mpirl.job import checkpoint

from conftest import JOBS, finish, run_cli, run_mpi, start_mpi, wait_for_train_steps

CARTPOLE = JOBS / "cartpole.toml"


def _state(cfg, world, steps):
    return {"identity": checkpoint.identity(cfg, world), "train_steps": steps, "job_time": float(steps),
            "weights": torch.arange(3.0)}


def test_checkpoints_are_written_whole_and_the_newest_kept(tmp_path):
    cfg, _ = load(CARTPOLE)
    for steps in (10, 20, 30, 40):
        checkpoint.save(tmp_path, _state(cfg, 4, steps), keep=2)
    names = [p.name for p in checkpoint.checkpoints(tmp_path)]
    assert names == ["ckpt-0000000030.pt", "ckpt-0000000040.pt"]
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
    # a file left half-written by a crash keeps its temporary name and is never taken for a checkpoint
    (tmp_path / "checkpoints" / "ckpt-0000000050.pt.tmp").write_bytes(b"\0" * 10)
    assert checkpoint.checkpoints(tmp_path)[-1].name == "ckpt-0000000040.pt"
    state = checkpoint.load(checkpoint.checkpoints(tmp_path)[-1])
    assert state["train_steps"] == 40 and state["weights"].tolist() == [0.0, 1.0, 2.0]


def test_identity_allows_new_stop_conditions_and_devices_only(tmp_path):
    cfg, _ = load(CARTPOLE)
    longer, _ = load(CARTPOLE, ["run.env_steps=500000", "run.wall_seconds=60", "log.interval=2"])
    elsewhere, _ = load(CARTPOLE, ["agent.device=cpu", "agent.torch_threads=2"])  # a GPU's checkpoint on a CPU
    other, _ = load(CARTPOLE, ["replay.capacity=1000"])
    saved = checkpoint.identity(cfg, 4)
    assert checkpoint.mismatch(saved, checkpoint.identity(longer, 4)) == ""
    assert checkpoint.mismatch(saved, checkpoint.identity(elsewhere, 4)) == ""
    older = {**saved, "agent.device": "'cuda'"}  # written before the device could change: it names it
    assert checkpoint.mismatch(older, checkpoint.identity(elsewhere, 4)) == ""
    assert "replay.capacity" in checkpoint.mismatch(saved, checkpoint.identity(other, 4))
    assert "world_size" in checkpoint.mismatch(saved, checkpoint.identity(cfg, 5))


def _fake_run(tmp_path, cfg_sets=(), world=4, steps=100):
    """A run directory as a real job leaves it: run.h5 and one checkpoint."""
    from mpirl.metrics.run_file import create_run_file
    cfg, text = load(CARTPOLE, list(cfg_sets))
    run_dir = tmp_path / "runs" / "cartpole-20260101-000000"
    create_run_file(run_dir, text, cfg.flat(), {"world_size": world})
    checkpoint.save(run_dir, _state(cfg, world, steps), keep=2)
    return run_dir


@pytest.mark.parametrize("case", ["no run", "no checkpoint", "other job", "other world size", "unreadable",
                                  "other version"])
def test_a_run_that_cannot_be_resumed_is_refused_before_any_rank_starts(tmp_path, case):
    run_dir = _fake_run(tmp_path)
    sets = ["--set", f'run.out_dir="{tmp_path / "runs"}"']
    target, want = str(run_dir), ""
    if case == "no run":
        target, want = str(tmp_path / "nowhere"), "no run.h5 there"
    elif case == "no checkpoint":
        for p in checkpoint.checkpoints(run_dir):
            p.unlink()
        want = "no complete checkpoint"
    elif case == "other job":
        sets += ["--set", "replay.capacity=1000"]
        want = "replay.capacity was 50000 in the checkpoint's job, is 1000 now"
    elif case == "other world size":
        sets += ["-n", "5"]
        want = "world_size was 4 in the checkpoint's job, is 5 now"
    elif case == "other version":  # a checkpoint of format 1, whose run's tables lack this version's columns
        cfg, _ = load(CARTPOLE)
        torch.save({**_state(cfg, 4, 100), "format": 1}, checkpoint.checkpoints(run_dir)[-1])
        want = f"format 1; this version reads format {checkpoint.FORMAT}"
    else:
        checkpoint.checkpoints(run_dir)[-1].write_bytes(b"not a checkpoint")
        want = "cannot be read"
    before = sorted(p.name for p in run_dir.rglob("*"))
    r = run_cli("launch", str(CARTPOLE), *sets, "--resume", target)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--resume" in r.stderr and want in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in run_dir.rglob("*")) == before  # nothing written, nothing lost


def test_resume_auto_finds_the_unfinished_run_and_skips_finished_ones(tmp_path):
    from mpirl.metrics.run_file import create_run_file, finish_run_file
    cfg, _ = load(CARTPOLE, [f'run.out_dir="{tmp_path / "runs"}"'])
    run_dir = _fake_run(tmp_path)
    # a newer unfinished run of another job whose name starts the same (a sweep's) is not this job's
    other, text = load(CARTPOLE, ['run.name="cartpole-baseline-s1"'])
    sweep = tmp_path / "runs" / "cartpole-baseline-s1-20260102-000000"
    create_run_file(sweep, text, other.flat(), {"world_size": 4})
    checkpoint.save(sweep, _state(other, 4, 500), keep=2)
    plan = checkpoint.plan_resume(cfg, 4, "auto")
    assert plan.run_dir == str(run_dir.resolve()) and plan.train_steps == 100 and plan.restart == 1
    finish_run_file(run_dir, "completed")
    assert checkpoint.plan_resume(cfg, 4, "auto") is None  # a new run starts


# ---------------------------------------------------------------- whole jobs
LONG = ("run.train_steps=3000", "run.env_steps=0", "run.target_return=nan", "run.wall_seconds=0",
        "replay.learning_starts=500", "checkpoint.every_steps=500", "log.interval=0.2")


def _budget(sets, steps: int) -> tuple:
    return (*[s for s in sets if not s.startswith("run.train_steps=")], f"run.train_steps={steps}")


def _preempt(tmp_path, signum, sets=LONG):
    """Start the long job, signal its mpiexec once it has trained a while (Open MPI forwards SIGUSR1 to every
    rank; one rank alone: tests/test_signals.py); returns its exit code and output. Its budget is one it never
    reaches, however fast this machine trains: the signal ends it (a resume may change the budget)."""
    out = tmp_path / "runs"
    with start_mpi(4, out, *_budget(sets, 100_000)) as job:
        wait_for_train_steps(job, out, 700)
        job.proc.send_signal(signum)
        code, text = finish(job, 180)
    return code, text, out


def _learner_steps(run_dir):
    with h5py.File(run_dir / "run.h5", "r") as f:
        return f["learner/batches/train_step"][()], f["learner/train/time"][()], f["learner/train/train_steps"][()]


# Columns that count since the run began: never lower in a later row, across a resume too.
LEARNER_COUNTERS = ("time", "train_steps", "env_steps", "compute_s", "comm_s", "bytes_in", "bytes_in_raw", "bytes_out",
                    "bytes_out_raw", "samples_trained", "episodes", "param_version", "skipped_batches")
BUFFER_COUNTERS = ("time", "experiences_in", "bytes_in", "bytes_out", "bytes_out_raw", "consumed", "priority_updates",
                   "stale_updates")


def _table(group):
    return {c: group[c][()] for c in group}


def _first_after(t, resumed_at):
    """Index of the first row the resumed process wrote."""
    after = np.flatnonzero(t > resumed_at)
    assert len(after), "no rows after the resume"
    return int(after[0])


def _non_negative(what, rate):
    """Rates are >= 0 (NaN: no full window yet). How high a rate may be is the machine's load, not a property of
    the run: a resumed learner refilling its replay leaves the actors the cores, and their first rows after it ran
    2.5 x the fastest of the run's other rows on a loaded CI machine. What a rate must match is its counter."""
    assert np.all(np.isnan(rate) | (rate >= 0)), f"{what}: a negative rate: {rate}"


def _rate_over_real_interval(what, rate, count, t, resumed_at, started=None):
    """Each row's rate is its counter's growth since the row before over the time between them (within one process).
    A process's first row (the run's first, the first after the resume) counts from when that process began: with
    ``started`` (an actor's rows: the job time its games began) exactly from then, from nought at the run's start;
    else at least its growth over the time since the resume."""
    first = _first_after(t, resumed_at)
    for i in range(len(t)):
        grew = count[i] - (count[i - 1] if i else 0)
        if i in (0, first) and started is not None:
            dt = t[i] - started[i]
            assert started[i] >= (resumed_at if i else 0) and dt > 0, (what, i, started[i], t[i], resumed_at)
        elif i == first:
            assert rate[i] * (t[i] - resumed_at) >= 0.98 * grew - 1, (what, i, rate[i], grew, t[i] - resumed_at)
            continue
        elif i == 0:
            continue
        else:
            dt = t[i] - t[i - 1]
        assert abs(rate[i] * dt - grew) <= 1 + 0.02 * grew, (
            f"{what}: row {i} says {rate[i]:.1f}/s; its counter grew {grew} in {dt:.3f} s")
    _non_negative(what, rate)


def _assert_metrics_continue(run_dir, resumed_at, train_steps):
    """A preempted and resumed run's metrics: every counter non-decreasing; every rate over its real interval, the
    first row after the resume too; no train step in two learner rows (unless the later counts skipped batches);
    a last learner row that holds batches."""
    with h5py.File(run_dir / "run.h5", "r") as f:
        train = _table(f["learner/train"])
        for col in LEARNER_COUNTERS:
            assert np.all(np.diff(train[col]) >= 0), f"learner/train/{col} decreases: {train[col]}"
        steps, skipped, loss, rate = (train[c] for c in ("train_steps", "skipped_batches", "loss", "train_steps_per_s"))
        for i in np.flatnonzero(np.diff(steps) == 0) + 1:
            assert skipped[i] > skipped[i - 1], (
                f"learner/train row {i} repeats train step {steps[i]} with no batch in it (loss {loss[i]}, {rate[i]}/s)")
        _rate_over_real_interval("learner train_steps_per_s", rate, steps, train["time"], resumed_at)
        assert steps[-1] == train_steps and np.isfinite(loss[-1]) and rate[-1] > 0, (
            f"the last learner/train row holds no batch: { {c: v[-1] for c, v in train.items()} }")
        shards = _table(f["learner/shards"])
        for b in np.unique(shards["buffer"]):
            rows = shards["buffer"] == b
            assert np.all(np.diff(shards["consumed"][rows]) >= 0), f"learner/shards consumed of buffer {b}"
            _non_negative(f"learner/shards inserted_per_s of buffer {b}", shards["inserted_per_s"][rows])
        for name in (k for k in f if k.startswith("buffer_")):
            buf = _table(f[name]["buffer"])
            for col in BUFFER_COUNTERS:
                assert np.all(np.diff(buf[col]) >= 0), f"{name}/buffer/{col} decreases: {buf[col]}"
            assert np.all(np.isfinite(buf["alpha"]) | (buf["consumed"] == 0)), (buf["alpha"], buf["consumed"])
            _rate_over_real_interval(f"{name} experiences_in_per_s", buf["experiences_in_per_s"],
                                     buf["experiences_in"], buf["time"], resumed_at)
            actors = _table(f[name]["actors"])
            for actor in f[name].attrs["actors"]:
                rows = actors["actor"] == actor
                assert np.all(np.diff(actors["env_steps"][rows]) >= 0), f"{name} actor {actor} env_steps"
                _rate_over_real_interval(f"{name} actor {actor} env_steps_per_s", actors["env_steps_per_s"][rows],
                                         actors["env_steps"][rows], actors["time"][rows], resumed_at,
                                         started=actors["started_s"][rows])


@pytest.mark.mpi
@pytest.mark.parametrize("architecture, replay", [("proposed", False), ("proposed", True), ("baseline", False)],
                         ids=["replay refilled", "replay checkpointed", "baseline"])
def test_preempted_job_resumes_and_its_metrics_continue(tmp_path, architecture, replay):
    sets = (*LONG, f"checkpoint.replay={str(replay).lower()}", f"replay.architecture={architecture}")
    events = architecture == "baseline"  # this one with TensorBoard's event files, resumed without them
    code, text, out = _preempt(tmp_path, signal.SIGUSR1, sets=(*sets, *(["log.tensorboard=true"] if events else [])))
    assert code == 75, text  # EX_TEMPFAIL: checkpointed, try again
    run_dir = next(out.glob("*/run.h5")).parent
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "preempted", dict(f.attrs)
        assert f.attrs["stop_reason"].startswith("preempted: SIGUSR1 on rank"), f.attrs["stop_reason"]
    steps, _, _ = _learner_steps(run_dir)
    stopped_at = int(steps[-1])
    assert 700 <= stopped_at < 100_000  # the signal stopped it
    total = stopped_at + 500  # what the resumed run trains to: a periodic checkpoint (every 500) and the end's
    ckpts = checkpoint.checkpoints(run_dir)
    assert ckpts[-1].name == f"ckpt-{stopped_at:010d}.pt" and len(ckpts) <= 2  # at the stop; keep = 2
    assert f"--resume {run_dir}" in text

    with h5py.File(run_dir / "buffer_1.h5", "r") as f:
        fill_at_stop = int(f["buffer/fill"][-1])
    snap = run_dir / "checkpoints" / "replay-1.npz"
    assert snap.exists() == replay
    stop_time = checkpoint.load(ckpts[-1])["job_time"]
    if events:
        from mpirl.metrics.tensorboard import event_files
        assert event_files(run_dir)  # the first start's, with rows up to its stop

    job = run_mpi(4, out, *_budget(sets, total), args=("--resume", str(run_dir)))
    assert job.proc.returncode == 0, job.output
    assert f"resuming {run_dir}" in job.output and f"ckpt-{stopped_at:010d}.pt" in job.output
    if events:  # they held rows after the checkpoint; nothing writes them on with log.tensorboard off
        assert not event_files(run_dir) and "log.tensorboard is off: the event files" in job.output, job.output
    if replay:  # the memory came back whole: the first row after the resume is at least that full
        assert f"buffer rank 1: replay restored, {fill_at_stop} records from replay-1.npz" in job.output
    with h5py.File(run_dir / "buffer_1.h5", "r") as f:
        t, fill = f["buffer/time"][()], f["buffer/fill"][()]
        first_after = fill[np.searchsorted(t, stop_time, side="right")]
        assert (first_after >= fill_at_stop) if replay else (first_after < fill_at_stop)
    assert job.run_dirs == [run_dir]  # the same directory, no new one
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["restarts"] == 1
        assert f"train_steps {total} reached" in f.attrs["stop_reason"]
        for b in (k for k in f if k.startswith("buffer_")):
            for actor in f[b].attrs["actors"]:
                rows = f[b]["actors"]["actor"][()] == actor
                assert np.all(np.diff(f[b]["actors"]["env_steps"][()][rows]) >= 0)  # each actor counts on
            assert np.all(np.diff(f[b]["buffer"]["experiences_in"][()]) >= 0)
            assert np.all(np.diff(f[b]["buffer"]["time"][()]) >= 0)
    steps, times, logged = _learner_steps(run_dir)
    np.testing.assert_array_equal(steps, np.arange(1, total + 1))  # every train step once: none repeated, none lost
    assert np.all(np.diff(times) >= 0) and np.all(np.diff(logged) >= 0)
    assert logged[-1] == total
    state = checkpoint.load(checkpoint.checkpoints(run_dir)[-1])
    assert state["train_steps"] == total and state["version"] > total // 16
    _assert_metrics_continue(run_dir, stop_time, total)


def test_a_checkpoint_from_before_a_setting_existed_resumes_where_it_is_at_its_default():
    """Issue 40 added agent.activation and friends: a checkpoint that does not name them was written by a job that
    ran as their defaults do, so a job at the defaults resumes from it; one that changes them does not."""
    from mpirl import config
    from mpirl.job import checkpoint as ckpt
    cfg, _ = config.load(JOBS / "a3c_cartpole.toml")
    now = ckpt.identity(cfg, 5)
    old = {k: v for k, v in now.items() if k not in ("agent.activation", "agent.lr_final", "a3c.clip_final")}
    assert ckpt.mismatch(old, now) == ""
    cfg.agent.activation = "tanh"
    why = ckpt.mismatch(old, ckpt.identity(cfg, 5))
    assert "agent.activation" in why and "unset" in why
