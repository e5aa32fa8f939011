"""The progress line: where a running job stands, one line every ``log.progress_seconds``::

    mpirl: 0:41  12,345 train steps (310 /s)  48,000 env steps  return 187.3  62 % of env_steps, 0:25 left

It holds the job time, the run's own step (train steps; a gradient run's updates; a DistQL run's merges) and its
rate over about the last :data:`WINDOW` seconds, the env steps, the recent mean return, and, where a stop condition
bounds the run (``run.train_steps``, ``run.env_steps``, ``run.wall_seconds``, as :func:`mpirl.metrics.watch.progress`
reads them; DistQL's ``distql.episodes``), the fraction done of the one expected to stop it first and the time
left until then, from the recent rate. A run that has ended says so at the end of its line.

The line is made from what ``mpirl watch`` reads: the run's algorithm's ``info.summarize`` (handed in; this layer
names no algorithm), which opens the HDF5 files read-only and without locks; :mod:`mpirl.metrics.reading` takes
from its summary what the line shows. A beat whose read fails (a table caught mid-flush) is skipped; a read that
takes longer than the interval delays the next beat, it never stacks reads.

Who prints it, and how it meets the job's own output: :mod:`mpirl.metrics.live`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from mpirl.metrics.formatting import fmt
from mpirl.metrics.reading import Reading, number, reading

RUN_DIR_LINE = "mpirl: run directory "  # rank 0's line naming the run directory (mpirl.job.wiring), then the path
WINDOW = 30.0  # seconds of job time over which the rates (and with them the time left) are measured

Summarize = Callable[[Path], dict[str, Any]]


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
    if attrs.get("status") in FINAL_STATUSES and number(attrs.get("wall_seconds")) is not None:
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
