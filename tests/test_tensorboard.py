"""TensorBoard event files (mpirl/metrics/tensorboard.py), read back with TensorBoard's own reader: they hold what
the HDF5 files hold. Rank 0's rows written by a real job as it runs, `mpirl tensorboard` on that run, a resumed run
without a point twice, and a missing package or a path without runs refused."""

import datetime as dt
import shutil
import sys

import h5py
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # the test extra has it

from mpirl import cli, config, registry
from mpirl.config import ConfigError
from mpirl.metrics import tensorboard, writer
from mpirl.metrics.run_file import create_run_file, mark_resumed, read_status
from mpirl.metrics.writer import MetricsFile

from conftest import JOBS, run_mpi

F8, I8 = np.float64, np.int64


def scalars(run_dir) -> dict:
    """tag -> (steps, values, wall times) of the run's event files, as TensorBoard reads them."""
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})  # 0: every point
    acc.Reload()
    return {tag: tuple(np.array([getattr(e, k) for e in acc.Scalars(tag)]) for k in ("step", "value", "wall_time"))
            for tag in acc.Tags()["scalars"]}


def assert_holds(events: dict, tag: str, steps, values) -> None:
    """``tag`` holds the finite ``values`` at their ``steps``, as TensorBoard keeps scalars (float32)."""
    values = np.asarray(values, F8)
    keep = np.isfinite(values)
    assert keep.any(), tag
    np.testing.assert_array_equal(events[tag][0], np.asarray(steps)[keep], err_msg=tag)
    np.testing.assert_array_equal(events[tag][1], values[keep].astype(np.float32), err_msg=tag)


def columns(path, table: str) -> dict:
    with h5py.File(path, "r") as f:
        return {c: ds[()] for c, ds in f[table].items()}


def start_epoch(run_dir) -> float:
    return dt.datetime.fromisoformat(read_status(run_dir)["start_time"]).timestamp()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """One tiny Ape-X CartPole job with ``log.tensorboard = true``, flushing every half second: the module's."""
    out = tmp_path_factory.mktemp("tensorboard")
    done = run_mpi(3, out, "run.train_steps=300", "run.target_return=nan", "replay.learning_starts=200",
                   "log.tensorboard=true", "log.interval=0.02", "log.flush_seconds=0.5")
    assert done.proc.returncode == 0, done.output
    yield done
    shutil.rmtree(out, ignore_errors=True)


@pytest.mark.mpi
def test_the_job_writes_rank_0_s_rows_as_events(job):
    run_dir = job.run_dir
    events = scalars(run_dir)
    train = columns(run_dir / "learner.h5", "train")
    assert len(train["time"]) >= 2
    for column in ("loss", "return_mean20", "train_steps", "p_t", "bytes_in"):  # the step: the row's env steps
        assert_holds(events, f"train/{column}", train["env_steps"], train[column])
    shards = columns(run_dir / "learner.h5", "shards")
    assert_holds(events, "shards/size", np.arange(len(shards["time"])), shards["size"])  # no step column: the row
    # Left out: the step's own column, the time, ids, the per-train-step table, and other ranks' files.
    assert not {"train/env_steps", "train/time", "shards/buffer", "batches/loss"} & set(events)
    assert not [tag for tag in events if tag.startswith("buffer_")]
    walls = events["train/train_steps"][2]
    np.testing.assert_allclose(walls - train["time"], walls[0] - train["time"][0], atol=1e-3)  # one clock
    assert abs(walls[0] - train["time"][0] - start_epoch(run_dir)) < 60  # run.h5 keeps the start to the second


@pytest.mark.mpi
def test_mpirl_tensorboard_writes_every_rank_s_tables(job, tmp_path, capsys):
    run_dir = tmp_path / job.run_dir.name
    shutil.copytree(job.run_dir, run_dir)
    live = scalars(run_dir)
    assert cli.main(["tensorboard", str(run_dir)]) == 2  # the job's event files are there: not without --force
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--force" in err, err
    assert cli.main(["tensorboard", str(tmp_path), "--force"]) == 0  # a directory of runs
    assert "tensorboard --logdir" in capsys.readouterr().out
    assert len(tensorboard.event_files(run_dir)) == 1  # replaced, not added to
    events = scalars(run_dir)
    for tag, (steps, values, _) in live.items():  # rank 0's tags as the job wrote them
        np.testing.assert_array_equal(events[tag][0], steps, err_msg=tag)
        np.testing.assert_array_equal(events[tag][1], values, err_msg=tag)
    episodes = columns(run_dir / "buffer_1.h5", "episodes")
    assert_holds(events, "buffer_1/episodes/return", episodes["env_steps"], episodes["return"])
    buffer = columns(run_dir / "buffer_1.h5", "buffer")
    assert_holds(events, "buffer_1/buffer/fill", np.arange(len(buffer["time"])), buffer["fill"])


def append(table, times) -> None:
    for t in times:
        table.append(time=t, env_steps=int(100 * t), loss=t / 10)


TRAIN = {"time": F8, "env_steps": I8, "loss": F8}


def test_a_resumed_run_writes_its_events_again_without_a_point_twice(tmp_path):
    run_dir = tmp_path / "run"
    create_run_file(run_dir, "", {}, {})
    start = start_epoch(run_dir)
    live = tensorboard.LiveEvents(run_dir, t0=start)
    try:
        mf = MetricsFile(run_dir / "learner.h5", flush_seconds=0.0)
        table, batches = mf.table("train", TRAIN), mf.table("batches", {"train_step": I8, "loss": F8})
        append(table, [1, 2, 3])
        batches.append(train_step=1, loss=0.5)
        assert mf.flush_if_due()
        assert scalars(run_dir)["train/loss"][0].tolist() == [100, 200, 300]  # at the flush, the file still open
        append(table, [4, 5])  # after the checkpoint at job time 3: the job dies after these
        mf.close()
    finally:
        live.close()
    assert scalars(run_dir)["train/loss"][0].tolist() == [100, 200, 300, 400, 500]
    mark_resumed(run_dir, 1, "ckpt-3.pt", {}, "", job_time=3.0)
    t0 = start + 100.0 - 3.0  # the resumed job's clock: job time 3 a hundred seconds after the start
    live = tensorboard.LiveEvents(run_dir, t0=t0)
    try:
        mf = MetricsFile(run_dir / "learner.h5", flush_seconds=0.0, resume=True)
        table = mf.table("train", TRAIN)
        table.truncate(table.rows_until("time", 3.0))  # as every role cuts its tables on resume
        append(table, [4.5, 6])
        mf.close()
    finally:
        live.close()
    assert writer.FLUSH_HOOKS == []
    events = scalars(run_dir)
    assert list(events) == ["train/loss"]  # batches has no time: left out
    steps, values, walls = events["train/loss"]
    assert steps.tolist() == [100, 200, 300, 450, 600]
    np.testing.assert_allclose(values, np.float32([0.1, 0.2, 0.3, 0.45, 0.6]))
    np.testing.assert_allclose(walls, [start + 1, start + 2, start + 3, t0 + 4.5, t0 + 6])
    assert len(tensorboard.event_files(run_dir)) == 1


def test_without_the_package_a_job_and_the_command_are_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` raises ImportError
    cfg, _ = config.load(JOBS / "cartpole.toml", ["log.tensorboard=true"])
    from mpirl.job.checks import check_job
    with pytest.raises(ConfigError, match=r"^log\.tensorboard: .*pip install 'mpirl\[tensorboard\]'"):
        check_job(cfg, registry.algorithm("apex"), cfg.world_size, "cartpole.toml")
    create_run_file(tmp_path / "run", "", {}, {})
    assert cli.main(["tensorboard", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'mpirl[tensorboard]'" in err, err


@pytest.mark.mpi
def test_a_run_whose_files_cannot_be_read_or_written_gets_no_event_files(job, tmp_path, capsys):
    """A run.h5 cut short (a copy that stopped halfway, a full disk) would give event files of nothing: refused, as
    is a run directory where the event files cannot go; nothing is written for any run named."""
    damaged, blocked = tmp_path / "damaged", tmp_path / "blocked"
    for run in (damaged, blocked):
        shutil.copytree(job.run_dir, run)
        shutil.rmtree(run / tensorboard.EVENTS_DIR, ignore_errors=True)
    whole = (damaged / "run.h5").read_bytes()
    (damaged / "run.h5").write_bytes(whole[:len(whole) // 3])
    (blocked / tensorboard.EVENTS_DIR).write_bytes(b"mine")  # a file where the directory goes
    for run, says in ((damaged, "run.h5 cannot open"), (blocked, "is a file, not the directory")):
        assert cli.main(["tensorboard", str(run), "--force"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err and "RUN_DIR: " in err, err
    assert cli.main(["tensorboard", str(tmp_path), "--force"]) == 2  # one bad run among them: none is written
    capsys.readouterr()
    assert not (damaged / tensorboard.EVENTS_DIR).exists()
    assert (blocked / tensorboard.EVENTS_DIR).read_bytes() == b"mine"


def test_a_path_without_runs_is_refused(tmp_path, capsys):
    assert cli.main(["tensorboard", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run.h5" in err, err
