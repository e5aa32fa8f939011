"""A run that says ``running`` is told apart from a dead one; rank files open after any death."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import h5py
import pytest

from mpirl import config
from mpirl.metrics import heartbeat
from mpirl.metrics.run_file import create_run_file, finish_run_file
from mpirl.metrics.summary import summarize
from mpirl.job.checkpoint import plan_resume

from conftest import JOBS, ROOT

HERE = socket.gethostname()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def beat(run_dir, ranks, age=0.0, every=heartbeat.EVERY) -> float:
    """A heartbeat ``age`` seconds old; returns the time it is that old at (for ``verdict(now=...)``)."""
    now = time.time()
    (run_dir / heartbeat.HEARTBEAT).write_text(json.dumps({"time": now - age, "every": every, "ranks": ranks}))
    return now


def a_run(tmp_path, name="run"):
    run_dir = tmp_path / "runs" / f"{name}-20260101-000000"
    create_run_file(run_dir, "", {"run.name": name}, {"slurm_job_id": ""})
    return run_dir


def test_verdict_from_rank_0_and_the_heartbeat_age(tmp_path):
    run_dir = a_run(tmp_path)
    assert heartbeat.verdict(run_dir) == (None, "")  # no heartbeat: cannot tell
    # The ages are judged at the moment they were written for (now=): however long this takes here.
    now = beat(run_dir, [[HERE, os.getpid()], [HERE, dead_pid()]])
    assert heartbeat.verdict(run_dir, now=now) == (True, "")  # rank 0 (this python) alive, heartbeat fresh
    now = beat(run_dir, [[HERE, dead_pid()], [HERE, os.getpid()]], age=3)
    alive, why = heartbeat.verdict(run_dir, now=now)
    assert alive is False and why.startswith("no heartbeat for 3 s; its rank 0") and "is gone" in why
    now = beat(run_dir, [["elsewhere", 1]], age=5)
    assert heartbeat.verdict(run_dir, now=now)[0] is True  # another host: only the age can tell
    now = beat(run_dir, [["elsewhere", 1]], age=heartbeat.STALE * heartbeat.EVERY + 30)
    assert heartbeat.verdict(run_dir, now=now) == (False,
                                                   f"no heartbeat for {heartbeat.STALE * heartbeat.EVERY + 30:.0f} s")


def test_info_says_dead_and_resume_skips_or_refuses_a_live_run(tmp_path):
    run_dir = a_run(tmp_path)
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "ckpt-0000000001.pt").write_bytes(b"not a checkpoint")
    cfg, _ = config.load(JOBS / "cartpole.toml", [f'run.out_dir="{tmp_path / "runs"}"', "run.name=run"])
    beat(run_dir, [[HERE, os.getpid()]])  # alive
    assert summarize(run_dir)["status"] == "running"
    assert plan_resume(cfg, 4, "auto") is None  # a live run is another job's: auto starts a new one
    with pytest.raises(config.ConfigError, match="is still running"):
        plan_resume(cfg, 4, str(run_dir))
    beat(run_dir, [[HERE, dead_pid()]], age=12)
    s = summarize(run_dir)  # judged now: the heartbeat is 12 s old and older the longer this takes
    age = re.match(r"no heartbeat for (\d+) s; its rank 0 ", s["stop_reason"] or "")
    assert s["status"] == "dead" and age and int(age.group(1)) >= 12, s["stop_reason"]
    with pytest.raises(config.ConfigError, match="cannot be read"):  # dead: auto takes it up
        plan_resume(cfg, 4, "auto")


def test_a_job_that_ends_between_the_read_and_the_look_at_its_rank_0_is_not_called_dead(tmp_path, monkeypatch):
    """Rank 0 writes the final status, then exits: a reader (``mpirl watch``, ``info``) that read "running" just
    before and finds rank 0 gone just after reads the file again, and says how the job ended (seen in a suite run
    under load: watch's last frame said "dead" for a job that completed)."""
    run_dir = a_run(tmp_path)
    beat(run_dir, [[HERE, dead_pid()]])
    look = heartbeat.verdict

    def ends_first(where, now=None):  # the job ends while the reader looks for its rank 0
        finish_run_file(where, "completed", stop_reason="train_steps 10 reached")
        return look(where, now)
    monkeypatch.setattr(heartbeat, "verdict", ends_first)
    s = summarize(run_dir)
    assert (s["status"], s["stop_reason"]) == ("completed", "train_steps 10 reached"), s["stop_reason"]
    monkeypatch.setattr(heartbeat, "verdict", look)
    run_dir = a_run(tmp_path, "gone")  # one that did die still says so
    beat(run_dir, [[HERE, dead_pid()]])
    assert summarize(run_dir)["status"] == "dead"


def test_a_rank_file_opens_after_a_death_before_its_first_row(tmp_path):
    path = tmp_path / "buffer_1.h5"
    code = ("import os, numpy as np; from mpirl.metrics.writer import MetricsFile; "
            f"m = MetricsFile({str(path)!r}, {{'role': 'buffer', 'rank': 1}}, flush_seconds=60); "
            "m.table('buffer', {'time': np.float64}); os._exit(9)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 9
    with h5py.File(path, "r") as f:
        assert f.attrs["role"] == "buffer" and f["buffer/time"].shape == (0,)
