"""The progress line (mpirl/metrics/progress.py) and how it is shown (mpirl/metrics/live.py): its text from each
family's summary, the console that puts it between the job's lines (redrawn on a terminal, appended elsewhere, never
after the summary), rank 0's follower process, and `mpirl launch` on a terminal."""

from __future__ import annotations

import fcntl
import io
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from datetime import datetime, timedelta

import pytest

from mpirl.metrics.live import CLEAR, Console, Follower, Live, follow
from mpirl.metrics.progress import Line, clock, job_seconds
from mpirl.metrics.run_file import create_run_file, finish_run_file

from conftest import JOBS, ROOT, mpi_env, processes_mentioning

LINE = re.compile(r"^mpirl: \d+:\d\d(:\d\d)?  ", re.M)  # a progress line (its job time first)


def star(train=12_000, env=40_000, ret=187.3, status="running", **job):
    """A learner-buffer-actor summary (Ape-X, QMIX, IMPALA) with what the line reads."""
    return {"status": status, "job": job, "buffers": [],
            "learner": {"train_steps": train, "env_steps": env, "return_mean20": ret}}


class Terminal(io.StringIO):
    def isatty(self):
        return True


# ---------------------------------------------------------------- the line's text
def test_the_line_of_a_run_bounded_by_env_steps():
    line = Line()
    first = line.text(star(**{"run.env_steps": 200_000}), 40.0)
    # the first beat has no window yet: the whole run's rates, 300 train steps and 1,000 env steps a second
    assert first == ("mpirl: 0:40  12,000 train steps (300 /s)  40,000 env steps  return 187.3  "
                     "20 % of env_steps, 2:40 left")
    second = line.text(star(train=15_000, env=60_000, **{"run.env_steps": 200_000}), 50.0)
    # then over the window: 2,000 env steps a second since the last beat
    assert second.endswith("(300 /s)  60,000 env steps  return 187.3  30 % of env_steps, 1:10 left"), second


def test_no_time_left_without_a_bound_and_the_nearest_bound_wins():
    free = Line().text(star(), 40.0)
    assert "%" not in free and "left" not in free
    assert free == "mpirl: 0:40  12,000 train steps (300 /s)  40,000 env steps  return 187.3"
    # train steps end in 40 s, the wall in 560 s, the target return tells no time: the train steps are shown
    both = Line().text(star(**{"run.train_steps": 24_000, "run.wall_seconds": 600.0, "run.target_return": 195.0}),
                       40.0)
    assert both.endswith("50 % of train_steps, 0:40 left"), both
    wall = Line().text(star(**{"run.wall_seconds": 3_600.0}), 3_590.0)
    assert wall.startswith("mpirl: 59:50  ") and wall.endswith("99 % of wall_seconds, 0:10 left"), wall


def test_before_the_first_rows_and_after_the_end():
    early = Line().text({"status": "running", "job": {"run.train_steps": 100}, "learner": None, "buffers": []}, None)
    assert early == "mpirl: -  - train steps  return -  0 % of train_steps"
    done = Line().text(star(train=24_000, status="completed", **{"run.train_steps": 24_000}), 3_725.0)
    assert done.endswith("return 187.3  100 % of train_steps  completed") and done.startswith("mpirl: 1:02:05  ")


def test_every_family_s_summary_gives_its_line():
    gradients = {"status": "running", "job": {"run.train_steps": 1_000}, "updates": {"version": 250},
                 "workers": [{"env_steps": 100}, {"env_steps": 200}], "episodes": {"last_window": 30.5}}
    assert Line().text(gradients, 10.0) == ("mpirl: 0:10  250 updates (25.0 /s)  300 env steps  return 30.5  "
                                            "25 % of train_steps, 0:30 left")
    exchange = {"status": "running", "job": {"distql.episodes": 100}, "merges": {"count": 30},
                "workers": [{"env_steps": 100, "episodes": 20, "last100_return": 3.0},
                            {"env_steps": 200, "episodes": 30, "last100_return": float("nan")}]}
    assert Line().text(exchange, 5.0) == ("mpirl: 0:05  30 merges (6.00 /s)  300 env steps  return 3.0  "
                                          "25 % of episodes, 0:15 left")
    assert Line().text({"status": "running", "job": {}}, 1.0) == "mpirl: 0:01  - steps  return -"  # a shape unknown


def test_clock_and_job_time():
    assert [clock(x) for x in (None, 0.4, 59.6, 61, 3_600, 90_061)] == ["-", "0:00", "1:00", "1:01", "1:00:00",
                                                                          "25:01:01"]
    start = datetime(2026, 1, 1, 12, 0, 0).astimezone()
    now = (start + timedelta(seconds=90)).timestamp()
    assert job_seconds({"status": "running", "start_time": start.isoformat()}, now) == pytest.approx(90)
    resumed = {"status": "running", "start_time": start.isoformat(), "restarts": 1,
               "resume_1_time": (start + timedelta(seconds=60)).isoformat(), "resume_1_job_time": 40.0}
    assert job_seconds(resumed, now) == pytest.approx(70)  # 40 s before the resume, 30 since
    assert job_seconds({"status": "completed", "wall_seconds": 12.5, "start_time": start.isoformat()}, now) == 12.5
    assert job_seconds({"status": "running"}, now) is None


# ---------------------------------------------------------------- the console
def test_a_file_gets_whole_lines_never_inside_the_job_s():
    out = io.StringIO()
    console = Console(out)
    assert not console.redraw
    console.show("mpirl: 0:01  a")
    console.job(b"half a li", out)
    assert console.show("mpirl: 0:02  b")  # skipped: the job's line is unfinished
    console.job(b"ne\n", out)
    console.show("mpirl: 0:03  c")
    console.close()
    assert not console.show("mpirl: 0:04  d")
    assert out.getvalue() == "mpirl: 0:01  a\nhalf a line\nmpirl: 0:03  c\n"


def test_a_terminal_gets_the_line_redrawn_in_place_and_ended_when_the_run_ends():
    out, state = Terminal(), {"running": True}
    console = Console(out, running=lambda: state["running"])
    assert console.redraw
    console.show("mpirl: 0:01  a")
    console.show("mpirl: 0:02  b")
    console.job(b"a warning\n", out)  # the line gives way to the job's, and comes back at the next beat
    console.show("mpirl: 0:03  c")
    state["running"] = False  # run.h5 says the run ended: rank 0's summary comes next
    console.job(b"the summary\n", out)
    assert not console.show("mpirl: 0:04  d")
    console.close()
    assert out.getvalue() == (f"{CLEAR}mpirl: 0:01  a{CLEAR}mpirl: 0:02  b{CLEAR}a warning\n"
                              f"{CLEAR}mpirl: 0:03  c\nthe summary\n")


def fake_run(tmp_path, **job):
    run_dir = tmp_path / "run"
    create_run_file(run_dir, "", {"agent.algorithm": "apex", **job}, {})
    return run_dir


def test_a_read_that_fails_is_a_skipped_beat(tmp_path):
    run_dir, calls = fake_run(tmp_path), []

    def summarize(_):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("a table caught mid-flush")
        return star()
    out = io.StringIO()
    assert follow(run_dir, summarize, 0.01, out, once=True) == 0
    assert len(calls) == 2 and len(LINE.findall(out.getvalue())) == 1, out.getvalue()


def test_the_launcher_s_view_passes_the_job_on_and_draws_no_line_after_the_summary(tmp_path):
    run_dir = fake_run(tmp_path)
    out, err = Terminal(), io.StringIO()
    live = Live(0.02, lambda _: star(), out=out, err=err)
    (r1, w1), (r2, w2) = os.pipe(), os.pipe()
    live.start(os.fdopen(r1, "rb"), os.fdopen(r2, "rb"))
    os.write(w1, f"mpirl: the command\nmpirl: run dir".encode())
    os.write(w1, f"ectory {run_dir}\n".encode())  # the line in two pieces
    os.write(w2, b"a warning\n")
    deadline = time.monotonic() + 60
    while out.getvalue().count(CLEAR + "mpirl: ") < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert live.run_dir == run_dir
    finish_run_file(run_dir, "completed")  # as rank 0 does before it prints its summary
    os.write(w1, b"the summary\n")
    os.close(w1)
    os.close(w2)
    live.finish()
    text = out.getvalue()
    assert text.startswith(f"mpirl: the command\nmpirl: run directory {run_dir}\n{CLEAR}mpirl: "), text
    assert text.endswith("\nthe summary\n") and CLEAR not in text.split("the summary")[1], text
    assert LINE.match(text.rsplit(CLEAR, 1)[1]), text  # the last line drawn stays, ended by a newline
    assert err.getvalue() == "a warning\n"


# ---------------------------------------------------------------- rank 0's follower
def test_rank_0_s_follower_prints_from_a_process_of_its_own_and_stops(tmp_path, capfd):
    run_dir = fake_run(tmp_path, **{"run.train_steps": 100})
    assert Follower(run_dir, 0.0).proc is None  # off
    early = Follower(run_dir, 60.0)
    early.stop()  # a job shorter than the interval starts nothing
    assert early.proc is None
    follower = Follower(run_dir, 0.2)
    try:
        seen, deadline = "", time.monotonic() + 60
        while len(LINE.findall(seen)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            seen += capfd.readouterr().out
        assert follower.proc is not None and follower.proc.pid != os.getpid()
    finally:
        follower.stop()
    assert follower.proc.poll() is not None
    assert seen.startswith("mpirl: ") and "  - train steps  return -  0 % of train_steps\n" in seen, seen
    time.sleep(0.5)
    assert capfd.readouterr().out.count("mpirl: ") <= 1  # nothing after stop() (one line may have been on its way)


# ---------------------------------------------------------------- a launch on a terminal
@pytest.mark.mpi
def test_launch_on_a_terminal_redraws_the_line_and_ends_it_before_the_summary(tmp_path):
    out = tmp_path / "runs"
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    # DistQL on Taxi, 3 ranks without torch, for 3 s: the cheapest job to start (the launcher tests see Ape-X's line)
    job = ("distql.workers=2", "distql.episodes=1000000", "distql.eval_episodes=0", "run.wall_seconds=3",
           "log.progress_seconds=0.5", f'run.out_dir="{out}"')
    proc = subprocess.Popen([sys.executable, "-m", "mpirl", "launch", str(JOBS / "taxi_distql.toml"),
                             *[x for s in job for x in ("--set", s)]],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=mpi_env(), cwd=ROOT)
    os.close(slave)
    got, deadline = b"", time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer of the terminal is gone
                    break
                if not chunk:
                    break
                got += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=60) == 0, got.decode(errors="replace")[-3000:]
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in processes_mentioning(str(out)):
            os.kill(pid, signal.SIGKILL)
    text = got.decode(errors="replace")
    head, summary = text.split("\nrun        ", 1)
    drawn = head.split(CLEAR)[1:]
    lines = [d for d in drawn if LINE.match(d)]
    assert len(lines) >= 2, text[-3000:]  # redrawn in place, beat after beat
    assert all(len(d.rstrip("\r\n")) <= 79 for d in lines)  # cut to the terminal's 80 columns less one
    assert LINE.match(drawn[-1]) and drawn[-1].endswith("\r"), drawn[-1]  # the last stays, ended (\n is \r\n here)
    assert " merges (" in drawn[-1] and " % of " in drawn[-1], drawn[-1]  # the exchange family's line
    assert CLEAR not in summary and not LINE.search(summary)  # nothing after the summary
