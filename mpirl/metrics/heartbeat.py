"""Is a run that says ``running`` alive? Rank 0's heartbeat, and the verdict readers draw from it.

Rank 0 writes ``RUN_DIR/heartbeat.json`` when the job starts and every
``EVERY`` seconds after, from a thread (so a long train step or a wait inside
MPI does not look like death): ``{"time": unix seconds, "every": EVERY,
"ranks": [[host, pid], ...]}``. Each write replaces the file whole.

A run whose ``run.h5`` still says ``running`` is **dead** when its rank 0 ran
on this host and is gone (rank 0 writes the final status before it exits), or
when the heartbeat is older than ``STALE`` times its period (a rank 0 on
another host). ``mpirl info``, ``mpirl watch`` and ``--resume auto`` use the verdict.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

HEARTBEAT = "heartbeat.json"
EVERY = 5.0  # seconds between beats
STALE = 4  # beats missed before a run whose processes cannot be seen is taken for dead


def write(run_dir: Path, ranks: list[tuple[str, int]], every: float = EVERY) -> None:
    """One beat, replacing the file whole (no fsync: a beat lost in a crash says the same)."""
    path = Path(run_dir) / HEARTBEAT
    tmp = path.with_name(f".{HEARTBEAT}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"time": time.time(), "every": every, "ranks": ranks}))
    os.replace(tmp, path)


class Heartbeat:
    """Beats from a daemon thread until :meth:`stop`; on rank 0 only."""

    def __init__(self, run_dir: Path, ranks: list[tuple[str, int]], every: float = EVERY):
        self.run_dir, self.ranks, self.every = Path(run_dir), [list(r) for r in ranks], every
        self._stop = threading.Event()
        write(self.run_dir, self.ranks, every)
        self._thread = threading.Thread(target=self._run, name="mpirl-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                write(self.run_dir, self.ranks, self.every)
            except OSError:  # a full or vanished disk must not kill the job from here
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.every)


def _alive(pid: int) -> bool:
    """A process with this PID exists and runs Python (a PID reused by something else does not count)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        try:
            os.kill(pid, 0)  # no /proc (macOS): existence only
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    return b"python" in cmdline or b"mpirl" in cmdline


def verdict(run_dir: Path, now: float | None = None) -> tuple[bool | None, str]:
    """``(alive, why)`` for a run whose status says running; ``why`` is '' unless dead; ``alive`` is None
    when there is no heartbeat to judge by (a run from before heartbeats)."""
    now = time.time() if now is None else now
    try:
        beat = json.loads((Path(run_dir) / HEARTBEAT).read_text())
        last, every = float(beat["time"]), float(beat.get("every", EVERY))
        ranks = [(str(h), int(p)) for h, p in beat.get("ranks", [])]
    except (OSError, ValueError, KeyError, TypeError):
        return None, ""  # no heartbeat (a run from before heartbeats): cannot tell
    age = max(0.0, now - last)
    here = socket.gethostname()
    if ranks and ranks[0][0] == here and not _alive(ranks[0][1]):  # rank 0 writes the final status before it exits
        return False, f"no heartbeat for {age:.0f} s; its rank 0 (PID {ranks[0][1]} on {here}) is gone"
    if age > STALE * every + 5:
        return False, f"no heartbeat for {age:.0f} s"
    return True, ""
