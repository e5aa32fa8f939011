"""The progress line (:mod:`mpirl.metrics.progress`) put beside a running job's own output.

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

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, TextIO

from mpirl.metrics.progress import RUN_DIR_LINE, Line, Summarize, beat, running

CLEAR = "\r\x1b[K"  # back to the start of the line, and clear it


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
