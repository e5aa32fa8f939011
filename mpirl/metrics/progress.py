"""The progress line: where a running job stands, one line every ``log.progress_seconds``::

    mpirl: 0:41  12,345 train steps (310 /s)  48,000 env steps  return 187.3  62 % of env_steps, 0:25 left

It holds the job time, the run's own step (train steps; a gradient run's updates; a DistQL run's merges) and its
rate over about the last :data:`WINDOW` seconds, the env steps, the recent mean return, and, where a stop condition
bounds the run (``run.train_steps``, ``run.env_steps``, ``run.wall_seconds``, as :func:`mpirl.metrics.watch.progress`
reads them; DistQL's ``distql.episodes``), the fraction done of the one expected to stop it first and the time
left until then, from the recent rate. A run that has ended says so at the end of its line.

The line is made from what ``mpirl watch`` reads: the run's algorithm's ``info.summarize`` (handed in; this layer
names no algorithm), which opens the HDF5 files read-only and without locks. Its summaries come in three shapes, one
per family (the learner-buffer-actor one of :mod:`mpirl.metrics.summary`, the gradient family's ``updates``, the
exchange family's ``merges``); :func:`reading` takes from each what the line shows. A beat whose read fails (a
table caught mid-flush) is skipped; a read that takes longer than the interval delays the next beat, it never
stacks reads.

Who prints it:

* ``mpirl launch`` (:class:`Live`): the launcher passes the job's output through to its own (a :class:`Console`),
  so the line is redrawn in place on a terminal (carriage return, clear to the end of the line) and appended as a
  plain line to a file or a pipe, always between the job's lines. It draws no line once ``run.h5`` says the run
  ended, and rank 0 writes that before its summary: no line follows the summary.
* a job without the launcher (``srun``, a plain ``mpiexec``: the Slurm templates): rank 0 starts a process of its
  own once the first interval has passed (:class:`Follower`), ``mpirl watch RUN_DIR --line``, which appends plain
  lines to rank 0's output (a batch job's output file), and ends it as its role ends, before its summary. The reads
  run in that process, not in a thread of rank 0: a slow read would hold the interpreter lock of rank 0's loop (the
  learner's, the parameter server's, the Q-server's) for as long as it takes.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, TextIO

from mpirl.metrics.formatting import fmt

RUN_DIR_LINE = "mpirl: run directory "  # rank 0's line naming the run directory (mpirl.job.wiring), then the path
WINDOW = 30.0  # seconds of job time over which the rates (and with them the time left) are measured
TIMED = ("train_steps", "env_steps", "wall_seconds")  # the stop conditions whose time left can be told
CLEAR = "\r\x1b[K"  # back to the start of the line, and clear it

Summarize = Callable[[Path], dict[str, Any]]


@dataclass
class Reading:
    """What one summary says that the line shows, whatever the algorithm."""
    unit: str = "steps"  # what the run counts as its step
    steps: float | None = None
    env_steps: float | None = None
    ret: float | None = None  # the recent mean return
    bounds: dict[str, float] = field(default_factory=dict)  # stop condition -> fraction done, 0..1
    status: str = "running"


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _learner_buffers(s: dict[str, Any]) -> tuple[str, Any, Any, Any, dict[str, float]]:
    """Ape-X, QMIX, IMPALA: the learner's last row."""
    learner = s.get("learner") or {}
    return "train steps", learner.get("train_steps"), learner.get("env_steps"), learner.get("return_mean20"), {}


def _gradients(s: dict[str, Any]) -> tuple[str, Any, Any, Any, dict[str, float]]:
    """The gradient family (``a3c``): updates applied, the workers' steps, the window's mean return."""
    env = sum(w.get("env_steps", 0) for w in s.get("workers", []))
    return "updates", s["updates"].get("version"), env, s.get("episodes", {}).get("last_window"), {}


def _exchange(s: dict[str, Any]) -> tuple[str, Any, Any, Any, dict[str, float]]:
    """The exchange family (``distql``): merges, the workers' steps and last 100 returns, episodes played toward
    every worker's ``distql.episodes``."""
    workers = s.get("workers", [])
    env = sum(w.get("env_steps", 0) for w in workers)
    rets = [r for r in (_number(w.get("last100_return")) for w in workers) if r is not None]
    total = int(s.get("job", {}).get("distql.episodes", 0) or 0) * max(len(workers), 1)
    bounds = {"episodes": min(sum(w.get("episodes", 0) for w in workers) / total, 1.0)} if total and workers else {}
    return "merges", s["merges"].get("count"), env, sum(rets) / len(rets) if rets else None, bounds


SHAPES = (("learner", _learner_buffers), ("updates", _gradients), ("merges", _exchange))  # a key its summaries hold


def reading(s: dict[str, Any], elapsed: float | None) -> Reading:
    """What the line shows of summary ``s`` at ``elapsed`` seconds of job time."""
    from mpirl.metrics.watch import progress
    unit, steps, env, ret, bounds = next((read(s) for key, read in SHAPES if key in s), ("steps", None, None, None, {}))
    r = Reading(unit, _number(steps), _number(env), _number(ret), bounds, str(s.get("status", "unknown")))
    # watch.progress reads the stop conditions from the learner's counters: the run's own step stands in for them
    view = {"job": s.get("job", {}), "elapsed_seconds": elapsed,
            "learner": {"train_steps": r.steps, "env_steps": r.env_steps, "return_mean20": r.ret}}
    r.bounds.update((what, frac) for what, frac, _ in progress(view) if what in TIMED)
    return r


def clock(seconds: float | None) -> str:
    """``M:SS``, or ``H:MM:SS`` from an hour on; '-' when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    m, s = divmod(int(round(max(seconds, 0.0))), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def per_second(rate: float) -> str:
    """A rate with about three figures."""
    return f"{fmt(rate, ',.0f' if abs(rate) >= 100 else ',.1f' if abs(rate) >= 10 else ',.2f')} /s"


def job_seconds(attrs: dict[str, Any], now: float | None = None) -> float | None:
    """Job time of a run from ``run.h5``'s root attributes: its ``wall_seconds`` once it ended, else the time since it
    started or, resumed, since its latest resume plus the job time that resume continued from (to the second)."""
    from datetime import datetime

    from mpirl.metrics.run_file import FINAL_STATUSES
    if attrs.get("status") in FINAL_STATUSES and _number(attrs.get("wall_seconds")) is not None:
        return float(attrs["wall_seconds"])
    now = time.time() if now is None else now
    k = int(attrs.get("restarts", 0) or 0)
    try:
        if k:
            since = datetime.fromisoformat(attrs[f"resume_{k}_time"]).timestamp()
            return now - since + float(attrs[f"resume_{k}_job_time"])
        return now - datetime.fromisoformat(attrs["start_time"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


class Line:
    """The progress line of one run, beat after beat: it keeps the readings of about the last :data:`WINDOW`
    seconds for the rates and the time left."""

    def __init__(self) -> None:
        self.seen: deque[tuple[float, Reading]] = deque()
        self.span = 4.0  # the least time a rate is measured over: two of the files' flushes (log.flush_seconds)

    def _rate(self, now: float, get: Callable[[Reading], float | None]) -> float | None:
        """Per second of job time: since the window's oldest reading that knew it (:attr:`span` old at least), else
        over the whole run."""
        x = get(self.seen[-1][1])
        if x is None:
            return None
        for then, old in self.seen:
            before = get(old)
            if before is not None and now - then >= self.span:
                return (x - before) / (now - then)
        return x / now if now > 0 else None

    def _left(self, r: Reading, now: float | None) -> tuple[str, float, float | None] | None:
        """The bound expected to stop the run first: (what, fraction done, seconds left or None)."""
        told = []
        for what, frac in r.bounds.items():
            rate = None if now is None else self._rate(now, lambda x, w=what: x.bounds.get(w))
            told.append((what, frac, 0.0 if frac >= 1.0 else (1.0 - frac) / rate if rate and rate > 0 else None))
        # the least time left; without one, the furthest along
        return min(told, key=lambda b: (b[2] is None, -b[1] if b[2] is None else b[2]), default=None)

    def text(self, s: dict[str, Any], elapsed: float | None) -> str:
        """The line for summary ``s`` at ``elapsed`` seconds of job time (None: unknown, no rates)."""
        r = reading(s, elapsed)
        self.span = 2 * float(s.get("job", {}).get("log.flush_seconds", 2.0) or 2.0)
        if elapsed is not None:
            self.seen.append((elapsed, r))
            while len(self.seen) > 2 and self.seen[1][0] <= elapsed - WINDOW:
                self.seen.popleft()
        rate = None if elapsed is None else self._rate(elapsed, lambda x: x.steps)
        parts = [f"mpirl: {clock(elapsed)}",
                 f"{fmt(r.steps)} {r.unit}" + ("" if rate is None else f" ({per_second(rate)})")]
        if r.env_steps is not None:
            parts.append(f"{fmt(r.env_steps)} env steps")
        parts.append(f"return {fmt(r.ret, ',.1f')}")
        bound = self._left(r, elapsed)
        if bound:
            what, frac, left = bound
            ending = "" if left is None or r.status != "running" else f", {clock(left)} left"
            parts.append(f"{math.floor(100 * frac)} % of {what}{ending}")
        if r.status != "running":
            parts.append(r.status)
        return "  ".join(parts)


def running(run_dir: Path) -> bool | None:
    """Whether ``run.h5`` says the run is running; None when it cannot be read just now."""
    from mpirl.metrics.run_file import read_status
    try:
        return read_status(run_dir).get("status") == "running"
    except Exception:  # noqa: BLE001 - a file being written can fail any way; the next beat asks again
        return None


def beat(run_dir: Path, summarize: Summarize, line: Line) -> tuple[str | None, bool]:
    """One read of the run: its line (None: the read failed, skip this beat) and whether the run has ended."""
    from mpirl.metrics.run_file import read_status
    try:
        s = summarize(run_dir)
        attrs = read_status(run_dir)
        return line.text(s, job_seconds(attrs)), s.get("status") != "running"
    except Exception:  # noqa: BLE001 - a table caught mid-flush, a file not there yet: the next beat reads again
        return None, False


def _isatty(stream: IO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _put(stream: IO, data: bytes) -> None:
    """Write to a text stream's bytes when it has them (the job's output passes unchanged); a stream that is gone
    (a closed terminal, a reader that left) takes nothing, and the job goes on."""
    try:
        raw = getattr(stream, "buffer", None)
        if raw is None:
            stream.write(data.decode(errors="replace"))
        else:
            stream.flush()
            raw.write(data)
            raw.flush()
        stream.flush()
    except (OSError, ValueError):
        pass


def _fit(text: str, stream: IO) -> str:
    """``text`` cut to the terminal's width less one: a line that wraps cannot be redrawn in place."""
    try:
        width = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return text
    return text[:width - 1] if width > 1 else text  # 0: a terminal that says no width


class Console:
    """Where the job's output and the progress line meet: one lock, so a line is never drawn inside another.

    On a terminal (``redraw``) the line is redrawn in place and cleared before the job writes; once the run has
    ended the line shown stays, ended by a newline, and none is drawn any more (:meth:`close`). Elsewhere each line is
    appended whole, never inside a line the job has begun. ``running`` (None: always) says whether the run still
    runs (None: cannot tell now; the beat is skipped)."""

    def __init__(self, out: IO, err: IO | None = None, redraw: bool | None = None,
                 running: Callable[[], bool | None] | None = None):
        self.out, self.err = out, err if err is not None else out
        self.redraw = _isatty(out) if redraw is None else redraw
        self.running = running or (lambda: True)
        self.showing = False  # a redrawn line is on the screen, the cursor at its end
        self.closed = False  # the run ended: no line any more
        self._open: set[int] = set()  # the streams whose output so far ends inside a line
        self._lock = threading.RLock()  # re-entered by close() when Ctrl-C interrupts a draw

    def show(self, text: str) -> bool:
        """Draw the line (or skip it while the job's output is inside a line); False once closed."""
        with self._lock:
            if self.closed:
                return False
            state = self.running()
            if state is False:
                self.close()
                return False
            if state is None or self._open:
                return True
            if self.redraw:
                _put(self.out, (CLEAR + _fit(text, self.out)).encode())
                self.showing = True
            else:
                _put(self.out, (text + "\n").encode())
            return True

    def job(self, data: bytes, stream: IO) -> None:
        """Pass on what the job wrote to ``stream`` (its stdout's or its stderr's destination)."""
        with self._lock:
            if self.showing:  # the job's last words after the run ended keep the last line; before, it gives way
                if self.running() is False:
                    self.close()
                else:
                    _put(self.out, CLEAR.encode())
                    self.showing = False
            _put(stream, data)
            (self._open.discard if data.endswith(b"\n") else self._open.add)(id(stream))

    def close(self) -> None:
        """No line any more; the one shown stays, on a line of its own."""
        with self._lock:
            if self.showing:
                _put(self.out, b"\n")
                self.showing = False
            self.closed = True


def beats(run_dir: Path, summarize: Summarize, seconds: float, console: Console, stop: threading.Event,
          once: bool = False, first: float = 0.0) -> None:
    """Draw the line every ``seconds``, the first after ``first`` seconds, until the run has ended (its last line
    drawn where the console still takes it), the console is closed or ``stop`` is set. After a read longer than
    ``seconds`` a whole interval passes before the next: reads never stack up."""
    line = Line()
    due = time.monotonic() + first
    if first > 0 and stop.wait(first):
        return
    while not stop.is_set():
        text, over = beat(run_dir, summarize, line)
        if text is not None and not console.show(text):
            return
        if over or (once and text is not None):
            return
        due += seconds
        now = time.monotonic()
        if due <= now:
            due = now + seconds
        stop.wait(due - now)


def follow(run_dir: Path, summarize: Summarize, seconds: float, stream: TextIO | None = None,
           once: bool = False) -> int:
    """``mpirl watch RUN_DIR --line``: the line every ``seconds`` until the run ends (or once), appended as plain
    lines (others may write to the same output: a rank's is ``mpiexec``'s terminal, shared with every rank); returns
    0."""
    console = Console(stream if stream is not None else sys.stdout, redraw=False)
    try:
        beats(run_dir, summarize, seconds, console, threading.Event(), once)
    except KeyboardInterrupt:
        pass
    finally:
        console.close()
    return 0


class Live:
    """``mpirl launch``'s view of its job: the job's output (``mpiexec``'s stdout and stderr pipes) passed on to the
    launcher's own through a :class:`Console`, and the progress line every ``seconds`` once rank 0 has named the run
    directory (:data:`RUN_DIR_LINE`). The launcher's own lines go through it too (:meth:`say`)."""

    def __init__(self, seconds: float, summarize: Summarize, out: IO | None = None, err: IO | None = None):
        self.seconds, self.summarize = seconds, summarize
        self.run_dir: Path | None = None
        self.console = Console(out if out is not None else sys.stdout, err if err is not None else sys.stderr,
                               running=self._running)
        self._named, self._stop = threading.Event(), threading.Event()
        self._relays: list[threading.Thread] = []

    def _running(self) -> bool | None:
        return True if self.run_dir is None else running(self.run_dir)

    def start(self, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        """Pass the job's pipes on from threads, and draw the line from another."""
        self._relays = [threading.Thread(target=self._relay, args=(pipe, dest, look), daemon=True,
                                         name=f"mpirl-relay-{look}")
                        for pipe, dest, look in ((stdout, self.console.out, True), (stderr, self.console.err, False))]
        for t in [*self._relays, threading.Thread(target=self._draw, daemon=True, name="mpirl-progress")]:
            t.start()

    def _relay(self, pipe: IO[bytes], dest: IO, look: bool) -> None:
        """Until the job's end of the pipe is closed: the pipe is always drained, whatever ``dest`` does."""
        head = b""  # stdout's text before the run directory's line, looked through
        fd = pipe.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            try:
                if look and self.run_dir is None:
                    head = self._look(head + data)
                self.console.job(data, dest)
            except Exception:  # noqa: BLE001 - whatever goes wrong here, the job must not block on a full pipe
                pass
        pipe.close()

    def _look(self, text: bytes) -> bytes:
        """Take the run directory from rank 0's line; the unfinished last line is kept for the next read."""
        *lines, rest = text.split(b"\n")
        for line in lines:
            if line.startswith(RUN_DIR_LINE.encode()):
                self.run_dir = Path(os.fsdecode(line[len(RUN_DIR_LINE):].rstrip(b"\r")))
                self._named.set()
                return b""
        return rest[-65536:]

    def _draw(self) -> None:
        self._named.wait()
        if not self._stop.is_set() and self.run_dir is not None:
            # The first line after one interval, as rank 0's follower: a job shorter than that prints none.
            beats(self.run_dir, self.summarize, self.seconds, self.console, self._stop, first=self.seconds)

    def say(self, text: str) -> None:
        """The launcher's own line, to its stderr."""
        self.console.job(f"mpirl: {text}\n".encode(), self.console.err)

    def finish(self, wait: float = 5.0) -> None:
        """Once the job has ended: the rest of its output passed on (up to ``wait`` seconds for a process that still
        holds a pipe), and no line any more."""
        deadline = time.monotonic() + wait
        for t in self._relays:
            t.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()
        self._named.set()
        self.console.close()


class Follower:
    """Rank 0's progress line when no launcher draws it (``srun``, a plain ``mpiexec``): once ``seconds`` have passed
    (0: never), a process of its own, ``mpirl watch RUN_DIR --line``, writes it into rank 0's output; :meth:`stop`
    ends it (before rank 0's summary). A job shorter than the interval starts nothing. Should rank 0 die, the
    process finds the run dead from its heartbeat at its next beat and ends, if the job's end did not take it
    along (Open MPI ends a rank's process group, Slurm its step's processes)."""

    def __init__(self, run_dir: Path, seconds: float):
        self.command = [sys.executable, "-m", "mpirl", "watch", str(Path(run_dir).resolve()), "--line",
                        "--interval", repr(float(seconds))]
        self.seconds = seconds
        self.proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._start, daemon=True, name="mpirl-progress")
        if seconds > 0:
            self._thread.start()

    def _start(self) -> None:
        if self._stop.wait(self.seconds):
            return
        try:  # no preexec_fn: CPython spawns it with vfork where it can, copying nothing of the rank's memory
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL)
        except OSError:
            pass

    def stop(self, wait: float = 5.0) -> None:
        """End the process (SIGTERM, SIGKILL after ``wait`` seconds) and reap it; nothing starts after this."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
