"""mpirl.metrics: writer, run.h5, summary and analysis/curves.py (no MPI)."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpirl.metrics.run_file import (create_run_file, finish_run_file, link_rank_files,
                                    read_status)
from mpirl.metrics.summary import first_reach, format_summary, summarize
from mpirl.metrics.writer import MetricsFile

ROOT = Path(__file__).resolve().parents[1]
BATCH, CAPACITY, ROWS = 32, 1000, 50
TRAIN_COLS = {c: np.float64 for c in ("time", "loss", "p_s", "p_t", "td_abs",
                                      "train_steps_per_s", "compute_s", "comm_s",
                                      "return_mean20")}
TRAIN_COLS.update({c: np.int64 for c in ("train_steps", "env_steps", "bytes_in",
                                         "samples_trained", "episodes", "param_version")})
BUFFER_COLS = {c: np.float64 for c in ("time", "experiences_in_per_s", "alpha",
                                       "total_priority")}
BUFFER_COLS.update({c: np.int64 for c in ("experiences_in", "bytes_in", "bytes_out", "fill",
                                          "stale_updates", "priority_updates", "consumed")})
EPISODE_COLS = {"time": np.float64, "actor": np.int32, "env_steps": np.int64,
                "return": np.float64, "length": np.int32}
ACTOR_COLS = {"time": np.float64, "actor": np.int32, "env_steps": np.int64,
              "env_steps_per_s": np.float64, "epsilon": np.float64, "param_version": np.int64}
JOB = {"run": {"name": "fake-cartpole"},
       "replay": {"architecture": "proposed", "capacity": CAPACITY, "batch_size": BATCH},
       "topology": {"buffers": 2, "actors_per_buffer": 2}}
BUFFERS = {1: (2, 3), 4: (5, 6)}  # buffer rank -> actor ranks


def new_run(run_dir: Path) -> None:
    create_run_file(run_dir, "[run]\nname = 'fake-cartpole'\n", JOB,
                    {"world_size": 7, "package_version": "0.1.0", "git_commit": None,
                     "hosts": ["node1"], "command_line": "mpirl run job.toml"})
    link_rank_files(run_dir, {"learner": "learner.h5",
                              **{f"buffer_{r}": f"buffer_{r}.h5" for r in BUFFERS}})


def write_learner(path: Path, rows: int = ROWS) -> None:
    i = np.arange(1, rows + 1)
    steps = 10 * i
    with MetricsFile(path, {"role": "learner", "rank": 0}) as mf:
        mf.table("train", TRAIN_COLS).extend(
            time=i * 1.0, loss=1.0 / i, p_s=np.full(rows, 2.0), p_t=np.full(rows, 3.0),
            td_abs=0.5 / i, train_steps_per_s=np.full(rows, 10.0), compute_s=0.75 * i,
            comm_s=0.25 * i, return_mean20=2.0 * i, train_steps=steps, env_steps=400 * i,
            bytes_in=steps * BATCH * 123, samples_trained=steps * BATCH,
            episodes=i, param_version=i // 2)


def write_buffer(path: Path, rank: int, actors: tuple[int, ...]) -> None:
    t = np.arange(1, ROWS + 1, dtype=float)
    with MetricsFile(path, {"role": "buffer", "rank": rank, "capacity": CAPACITY,
                            "architecture": "proposed"}) as mf:
        buf = mf.table("buffer", BUFFER_COLS)
        for k in t:  # one row per second, like the buffer loop
            buf.append(time=k, experiences_in=int(200 * k), experiences_in_per_s=200.0,
                       bytes_in=int(2e4 * k), bytes_out=int(1e4 * k),
                       fill=min(int(200 * k), CAPACITY), stale_updates=rank,
                       priority_updates=int(100 * k), consumed=int(160 * k), alpha=1.25,
                       total_priority=50.0)
        ep = mf.table("episodes", EPISODE_COLS)
        for k in t[::2]:  # returns rise with time
            for a in actors:
                ep.append(time=k + 0.01 * a, actor=a, env_steps=int(100 * k),
                          **{"return": 2.0 * k + a}, length=int(2 * k + a))
        act = mf.table("actors", ACTOR_COLS)
        for k in t:
            act.extend(time=[k] * len(actors), actor=list(actors),
                       env_steps=[int(100 * k) + a for a in actors],
                       env_steps_per_s=[100.0 + a for a in actors],
                       epsilon=[0.4 ** (1 + a) for a in actors],
                       param_version=[int(k) // 2] * len(actors))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    new_run(d)
    write_learner(d / "learner.h5")
    for rank, actors in BUFFERS.items():
        write_buffer(d / f"buffer_{rank}.h5", rank, actors)
    finish_run_file(d, "completed", stop_reason="max_train_steps", wall_seconds=51.5)
    return d


def expected_returns() -> np.ndarray:
    rows = [(k + 0.01 * a, 2.0 * k + a) for acts in BUFFERS.values()
            for k in np.arange(1, ROWS + 1, dtype=float)[::2] for a in acts]
    return np.array([r for _, r in sorted(rows)])


def test_summary_values(run_dir: Path) -> None:
    s = summarize(run_dir)
    assert s["status"] == "completed" and s["stop_reason"] == "max_train_steps"
    assert s["wall_seconds"] == 51.5 and s["end_time"]
    assert s["name"] == "fake-cartpole" and s["architecture"] == "proposed"
    assert s["world_size"] == 7 and s["roles"] == {"learner": 1, "buffers": 2, "workers": 0,
                                                         "worker_on_learner": False, "actors": 4}
    assert s["notes"] == [] and set(s["files"].values()) == {"ok"}
    L = s["learner"]
    assert L["rows"] == ROWS and L["train_steps"] == 10 * ROWS
    assert L["train_steps_per_s"] == pytest.approx(10.0)
    assert L["loss"] == pytest.approx(np.mean(1.0 / np.arange(46, 51)))
    assert (L["p_s"], L["p_t"]) == (pytest.approx(2.0), pytest.approx(3.0))
    assert L["comm_fraction"] == pytest.approx(0.25)
    assert L["compute_fraction"] == pytest.approx(0.75)
    assert L["bytes_per_sample"] == pytest.approx(123.0)
    assert [b["rank"] for b in s["buffers"]] == [1, 4]
    b = s["buffers"][0]
    assert b["experiences_in"] == 200 * ROWS and b["experiences_in_per_s"] == pytest.approx(200.0)
    assert b["fill"] == CAPACITY and b["fill_fraction"] == pytest.approx(1.0)
    assert b["alpha"] == pytest.approx(1.25) and b["stale_updates"] == 1
    assert b["actors"] == [2, 3] and b["episodes"] == 50
    rets = expected_returns()
    e = s["episodes"]
    assert e["count"] == len(rets) == 100
    assert e["first20_mean"] == pytest.approx(rets[:20].mean())
    assert e["last20_mean"] == pytest.approx(rets[-20:].mean())
    assert e["best"] == pytest.approx(rets.max())
    curve = e["curve"]["mean_return"]
    assert len(curve) == 8 and sum(e["curve"]["count"]) == 100
    assert all(x < y for x, y in zip(curve, curve[1:]))  # returns rise
    assert [a["actor"] for a in s["actors"]] == [2, 3, 5, 6]
    a5 = s["actors"][2]
    assert a5["buffer"] == "buffer_4" and a5["time_s"] == ROWS
    assert a5["env_steps"] == 100 * ROWS + 5 and a5["epsilon"] == pytest.approx(0.4 ** 6)
    assert a5["env_steps_per_s"] == pytest.approx(105.0)
    own = 2.0 * np.arange(1, ROWS + 1, dtype=float)[::2] + 5  # actor 5's returns, in time order
    assert a5["episodes"] == len(own) == 25
    assert a5["last20_mean"] == pytest.approx(own[-20:].mean())
    assert a5["best20_mean"] == pytest.approx(own[-20:].mean())  # its returns rise


@pytest.mark.parametrize("actors", [None, [5]])
def test_first_reach_against_a_plain_loop(run_dir: Path, actors) -> None:
    # (time, actor, env_steps, return) of every episode the fake buffers wrote, in time order.
    eps = sorted((k + 0.01 * a, a, int(100 * k), 2.0 * k + a) for acts in BUFFERS.values()
                 for k in np.arange(1, ROWS + 1, dtype=float)[::2] for a in acts)
    counted = [e for e in eps if actors is None or e[1] in actors]
    for target in (30.0, 60.0, 1e9):
        got = first_reach(run_dir, target, actors=actors)
        hit = next((i for i in range(19, len(counted))
                    if np.mean([e[3] for e in counted[i - 19:i + 1]]) >= target), None)
        if hit is None:
            assert got == {"seconds": None, "env_steps": None, "episodes": None}
            continue
        t = counted[hit][0]
        steps = sum(max(e[2] for e in eps if e[1] == a and e[0] <= t) for a in {e[1] for e in eps if e[0] <= t})
        assert got == {"seconds": pytest.approx(t), "env_steps": steps, "episodes": hit + 1}


def test_format_summary(run_dir: Path) -> None:
    text = format_summary(summarize(run_dir))
    lines = text.splitlines()
    assert 25 <= len(lines) <= 50
    for key in ("completed (max_train_steps)", "architecture proposed", "train steps",
                "compute / comm", "75.0 %", "25.0 %", "bytes in / sample", "123 B",
                "buffer_1", "buffer_4", "first 20", "last 20", "curve (8 bins", "return "):
        assert key in text, key
    row = next(ln.split() for ln in lines if ln.split()[:2] == ["5", "buffer_4"])
    own = 2.0 * np.arange(1, ROWS + 1, dtype=float)[::2] + 5
    assert row[-3:] == ["25", f"{own[-20:].mean():.1f}", f"{own[-20:].mean():.1f}"]  # episodes, last 20, best 20


def test_run_file(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = read_status(run_dir)
    assert st["status"] == "completed" and st["stop_reason"] == "max_train_steps"
    other = tmp_path / "moved"
    run_dir.rename(other)  # links are relative: the directory can move
    monkeypatch.chdir(tmp_path.parent)
    with h5py.File(other / "run.h5") as f:
        assert len(f["learner/train/loss"]) == ROWS
        assert f["buffer_4"].attrs["rank"] == 4
        assert f["job"].attrs["replay.capacity"] == CAPACITY
        assert "name = 'fake-cartpole'" in f["job/toml"][()].decode()
        assert f["provenance"].attrs["world_size"] == 7
    with pytest.raises(FileExistsError):
        create_run_file(other, "", {}, {})
    with pytest.raises(ValueError):
        finish_run_file(other, "done")


def test_curves_png(run_dir: Path, tmp_path: Path) -> None:
    script = ROOT / "analysis" / "curves.py"
    r = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    png = run_dir / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "run.h5" in r.stderr


def test_writer_refuses_overwrite_and_checks_columns(tmp_path: Path) -> None:
    path = tmp_path / "x.h5"
    mf = MetricsFile(path, {"role": "learner"})
    t = mf.table("train", {"time": np.float64, "loss": np.float32})
    with pytest.raises(ValueError, match="loss"):
        t.append(time=1.0)
    with pytest.raises(ValueError, match="bogus"):
        t.append(time=1.0, loss=0.1, bogus=3)
    with pytest.raises(ValueError, match="unequal"):
        t.extend(time=[1.0, 2.0], loss=[0.1])
    t.append(time=1.0, loss=0.5)
    t.extend(time=[2.0, 3.0], loss=[0.4, 0.3])
    assert t.rows == 3 and mf.flush_if_due() is False
    mf.close()
    mf.close()  # idempotent
    with pytest.raises(FileExistsError):
        MetricsFile(path)
    with h5py.File(path) as f:
        assert f["train/loss"][:].tolist() == pytest.approx([0.5, 0.4, 0.3])
        assert f["train/time"].chunks == (1024,) and f["train/time"].maxshape == (None,)


def test_running_run_without_end_time(tmp_path: Path) -> None:
    d = tmp_path / "run"
    new_run(d)
    (d / "buffer_4.h5").write_bytes(b"not an hdf5 file")
    s = summarize(d)
    assert s["status"] == "running" and s["end_time"] is None and s["wall_seconds"] is None
    assert s["learner"] is None and s["episodes"]["count"] == 0 and s["actors"] == []
    notes = "\n".join(s["notes"])
    assert "learner.h5: missing" in notes and "buffer_1.h5: missing" in notes
    assert "h5clear -s" in notes
    text = format_summary(s)
    assert "status        running" in text and "no rows yet" in text


KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import test_metrics as tm
    d = Path(sys.argv[1])
    tm.new_run(d)
    tm.write_buffer(d / "buffer_1.h5", 1, (2, 3))
    mf = tm.MetricsFile(d / "learner.h5", {{"role": "learner", "rank": 0}}, flush_seconds=0.0)
    train = mf.table("train", tm.TRAIN_COLS)
    row = {{c: 1 for c in tm.TRAIN_COLS}}
    for k in range(30):
        train.append(**{{**row, "time": float(k + 1), "train_steps": 10 * (k + 1)}})
    assert mf.flush_if_due()
    print("flushed", train.rows, flush=True)
    for k in range(30, 40):  # appended but never flushed
        train.append(**{{**row, "time": float(k + 1), "train_steps": 10 * (k + 1)}})
    time.sleep(120)
""")


def test_killed_writer_still_summarizes(tmp_path: Path) -> None:
    d = tmp_path / "run"
    code = KILLED_WRITER.format(tests=str(Path(__file__).parent))
    proc = subprocess.Popen([sys.executable, "-c", code, str(d)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert line.startswith("flushed"), line
        flushed = int(line.split()[1])
        live = summarize(d)  # while the writer still holds the file open
        assert live["status"] == "running" and live["learner"]["rows"] >= flushed
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    s = summarize(d)
    assert s["status"] == "running" and s["end_time"] is None
    assert s["learner"]["rows"] >= flushed and s["learner"]["train_steps"] >= 10 * flushed
    assert s["buffers"][0]["experiences_in"] == 200 * ROWS
    assert math.isnan(s["learner"]["bytes_per_sample"]) is False
    with h5py.File(d / "run.h5") as f:  # plain open, default locking, after kill -9
        assert len(f["learner/train/time"]) >= flushed
    assert "running" in format_summary(s)
