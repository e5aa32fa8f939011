"""Episode sampling for a QMIX learner: uniform and AccMER against plain numpy, the gather included.

    mpirl bench marl [--reps 5]

Predator-prey-sized episodes: 8 agents, T = 200 (201 rows per field): obs
(201, 8, 5, 5, 3) uint8, state (201, 10, 10, 3) uint8, avail (201, 8, 6) bool, actions
(201, 8) int64, reward f32, terminated and filled bool: 205 kB per episode, so
d = 10,000 episodes hold 2.0 GB (if the machine has less than twice that available,
T is cut and the output says so). Episode lengths vary (T/2 .. T).

For d = 1,000 and 10,000 stored episodes and batches of b = 128 and 256, the time of
one learner batch, in the same process one after the other:

* **numpy**: what a plain learner writes: ``rng.choice(d, b, replace=False)`` and a
  fancy index ``field[ids]`` of every field (fresh arrays every batch).
* **uniform**: :class:`~mpirl.replay.samplers.UniformSampler` picks, gathered by
  :meth:`~mpirl.replay.episodes.EpisodeStore.gather_picks` into the learner's
  preallocated batch arrays (``np.take(out=, mode='clip')``).
* **accmer**: :class:`~mpirl.replay.samplers.AccMERSampler` (alpha 0.5, discount 0.8):
  per step the sample, the gather of the b/2 uniform episodes, and the weight update
  with decay; the reuse block (b/2 episodes) is gathered once per window of
  W = d // b steps. Timed over whole windows, so the per-step figure is amortised.

Ratios: each implementation against numpy, and accmer against uniform (> 1: faster).
Last-level-cache misses are counted with ``perf stat`` around each timed run when the
machine exposes hardware counters; on VMs without them the output says why not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mpirl.bench.report import MIN_REPS, Row
from mpirl.replay.episodes import EpisodeStore
from mpirl.replay.samplers import AccMERSampler, UniformSampler

AGENTS, STEPS = 8, 200
DS, BS = (1_000, 10_000), (128, 256)
ALPHA, DISCOUNT = 0.5, 0.8
NUMPY, UNIFORM, ACCMER = "numpy choice + fancy index", "mpirl uniform", "mpirl accmer"
EVENTS = ("LLC-load-misses", "cache-misses")


def episode_spec(steps: int = STEPS, agents: int = AGENTS) -> dict:
    """Predator-prey's episode record: every field (steps + 1, ...)."""
    rows = steps + 1
    return {"obs": ((rows, agents, 5, 5, 3), np.uint8), "state": ((rows, 10, 10, 3), np.uint8),
            "avail": ((rows, agents, 6), np.bool_), "actions": ((rows, agents), np.int64),
            "reward": ((rows,), np.float32), "terminated": ((rows,), np.bool_), "filled": ((rows,), np.bool_)}


def episode_bytes(spec: dict) -> int:
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in spec.values())


def _available() -> int:
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return 1 << 40


def _fill(store: EpisodeStore, d: int, rng: np.random.Generator, chunk: int = 32) -> None:
    """``d`` episodes, untimed: ``chunk`` random templates with lengths T/2 .. T, added over and over."""
    spec, steps = store.spec, store.rows - 1
    tmpl = {}
    for name, (shape, dtype) in spec.items():
        if np.dtype(dtype) == np.bool_:
            tmpl[name] = rng.random((chunk, *shape)) < 0.5
        else:
            tmpl[name] = rng.integers(0, 5, (chunk, *shape)).astype(dtype)
    lengths = rng.integers(max(1, steps // 2), steps + 1, chunk)
    tmpl["filled"] = np.arange(steps + 1) < lengths[:, None]
    while store.size < d:
        k = min(chunk, d - store.size)
        store.add({name: a[:k] for name, a in tmpl.items()})


# ---------------------------------------------------------------- perf
def perf_event() -> tuple[str | None, str]:
    """The first countable LLC-miss event, or ``(None, reason)``."""
    perf = shutil.which("perf")
    if perf is None:
        return None, "perf is not installed"
    try:
        r = subprocess.run([perf, "stat", "-x", ",", "-e", ",".join(EVENTS), "--", sys.executable, "-c", "pass"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"perf stat failed: {err}"
    seen = {}
    for line in r.stderr.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2] in EVENTS:
            seen[parts[2]] = parts[0]
    for event in EVENTS:
        if seen.get(event, "").strip().isdigit():
            return event, ""
    if r.returncode != 0 or not seen:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"perf stat exited {r.returncode}: {last}"
    why = ", ".join(f"{e} {v}" for e, v in seen.items())
    if not os.path.exists("/sys/bus/event_source/devices/cpu"):
        why += "; the kernel has no hardware PMU (a VM without virtualised performance counters)"
    return None, f"perf stat reads {why}"


class PerfCount:
    """``perf stat -e event -p <this process>`` around a block; ``.value`` the count (or None)."""

    def __init__(self, event: str | None):
        self.event, self.value, self.proc = event, None, None

    def __enter__(self):
        if self.event:
            self.proc = subprocess.Popen(["perf", "stat", "-x", ",", "-e", self.event, "-p", str(os.getpid())],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            self._wait_attached()
        return self

    def _wait_attached(self, seconds: float = 60.0) -> None:
        """Until perf holds a counter on every thread of this process (its perf_event descriptors), or has ended:
        however long perf takes to start on this machine, the block is counted from its first instruction."""
        fds, tasks = Path(f"/proc/{self.proc.pid}/fd"), Path(f"/proc/{os.getpid()}/task")
        if not fds.is_dir():  # no /proc: nothing to watch, give perf a moment
            time.sleep(0.3)
            return
        deadline = time.monotonic() + seconds
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                counters = sum(1 for fd in fds.iterdir() if os.readlink(fd) == "anon_inode:[perf_event]")
                if counters and counters >= len(list(tasks.iterdir())):
                    return
            except OSError:  # a descriptor closed while listed
                pass
            time.sleep(0.01)

    def __exit__(self, *exc):
        if self.proc is None:
            return False
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        for line in err.splitlines():
            parts = line.split(",")
            if len(parts) > 2 and parts[2] == self.event and parts[0].strip().isdigit():
                self.value = float(parts[0])
        return False


# ---------------------------------------------------------------- the three learners' loops
def _time_steps(step, reps: int, seconds: float, window: int = 1) -> tuple[list[float], int]:
    """Per repetition µs per call of ``step`` over whole windows of ``window`` calls (after one
    untimed warm-up window); also the total number of timed calls."""
    out, total = [], 0
    for rep in range(reps + 1):
        calls, start = 0, time.perf_counter()
        while True:
            for _ in range(window):
                step()
            calls += window
            elapsed = time.perf_counter() - start
            if elapsed >= seconds and calls >= 3:
                break
        if rep:
            out.append(1e6 * elapsed / calls)
            total += calls
    return out, total


def bench_config(store: EpisodeStore, d: int, b: int, reps: int, seconds: float, event: str | None,
                 seed: int = 0) -> tuple[dict, dict, int]:
    """µs per batch and LLC misses per batch (None if not countable) of the three loops."""
    fields = store.fields
    times, misses = {}, {}
    batch = store.batch_arrays(b)
    rng = np.random.default_rng(seed)
    weights = rng.random(b) * 2

    def numpy_step():
        ids = rng.choice(d, b, replace=False)
        return {name: f[ids] for name, f in fields.items()}

    uniform = UniformSampler(store.capacity)
    uniform.on_insert(np.arange(store.size), store.versions[:store.size])

    def uniform_step():
        p = uniform.sample(b, d, rng)
        store.gather_picks(p, batch)
        uniform.update(p.ids, p.versions, weights)

    accmer = AccMERSampler(store.capacity, b, alpha=ALPHA, discount=DISCOUNT)
    accmer.on_insert(np.arange(store.size), store.versions[:store.size])
    accmer.update(np.arange(d), store.versions[:d], rng.random(d))  # distinct weights to choose from

    def accmer_step():
        p = accmer.sample(b, d, rng)
        store.gather_picks(p, batch)
        accmer.update(p.ids, p.versions, weights)

    window = max(1, d // b)
    for name, step, win in ((NUMPY, numpy_step, 1), (UNIFORM, uniform_step, 1), (ACCMER, accmer_step, window)):
        with PerfCount(event) as pc:
            times[name], calls = _time_steps(step, reps, seconds, win)
        misses[name] = None if pc.value is None else pc.value / calls
    return times, misses, window


def run(reps: int = MIN_REPS, ds: tuple = DS, bs: tuple = BS, steps: int = STEPS, seconds: float = 0.3) -> list[Row]:
    event, why = perf_event()
    llc = f"LLC misses: counted with perf stat -e {event}" if event else f"LLC misses: not countable here ({why})"
    notes = [llc]
    rows: list[Row] = []
    table = []
    for d in ds:
        spec = episode_spec(steps)
        per = episode_bytes(spec)
        budget = _available() // 2
        t = steps
        while t > 1 and d * episode_bytes(episode_spec(t)) > budget:
            t = t // 2
        if t != steps:
            spec, per = episode_spec(t), episode_bytes(episode_spec(t))
            notes.append(f"d={d}: T cut from {steps} to {t} ({d * episode_bytes(episode_spec(steps)) / 2**30:.2f} GB "
                         f"would exceed half the available memory)")
        store = EpisodeStore(spec, d)
        _fill(store, d, np.random.default_rng(d))
        shape = f"T={t}, {per / 1e3:.0f} kB/episode, {store.nbytes / 2**30:.2f} GB stored"
        for b in bs:
            if b > d:
                continue
            times, misses, window = bench_config(store, d, b, reps, seconds, event)
            tag = f"d={d} b={b}"
            rows.append(Row(f"{tag} uniform: sample + gather", "us/batch", UNIFORM, NUMPY,
                            values={UNIFORM: times[UNIFORM], NUMPY: times[NUMPY]}, higher_is_better=False,
                            note=shape))
            rows.append(Row(f"{tag} accmer alpha {ALPHA:g}: sample + gather + weights (amortised over W={window})",
                            "us/batch", ACCMER, NUMPY, values={ACCMER: times[ACCMER], NUMPY: times[NUMPY]},
                            higher_is_better=False, note=shape))
            rows.append(Row(f"{tag} accmer vs uniform", "us/batch", ACCMER, UNIFORM,
                            values={ACCMER: times[ACCMER], UNIFORM: times[UNIFORM]}, higher_is_better=False,
                            note=llc if event is None else ""))
            if event is not None and all(v is not None for v in misses.values()):
                rows.append(Row(f"{tag} {event} per batch", "misses/batch", ACCMER, UNIFORM,
                                values={k: [v] for k, v in misses.items()}, higher_is_better=False))
            table.append((d, b, t, window, times, misses))
        del store
    print(format_table(table, event), flush=True)
    for line in notes:
        print(line, flush=True)
    return rows


def format_table(table: list, event: str | None) -> str:
    """One line per (d, b): medians in µs per batch and the ratios (> 1: the first is faster)."""
    med = lambda v: float(np.median(v))  # noqa: E731
    head = (f"  {'d':>6s} {'b':>4s} {'T':>4s} {'W':>4s} {'numpy us':>10s} {'uniform us':>11s} {'accmer us':>10s}"
            f" {'numpy/uniform':>14s} {'numpy/accmer':>13s} {'uniform/accmer':>15s}")
    if event:
        head += f"  {event + '/batch (numpy, uniform, accmer)':>40s}"
    lines = ["episode batches (medians; ratios > 1: the second is faster)", head]
    for d, b, t, w, times, misses in table:
        n, u, a = med(times[NUMPY]), med(times[UNIFORM]), med(times[ACCMER])
        line = (f"  {d:>6,d} {b:>4d} {t:>4d} {w:>4d} {n:>10,.0f} {u:>11,.0f} {a:>10,.0f}"
                f" {n / u:>14.2f} {n / a:>13.2f} {u / a:>15.2f}")
        if event:
            counts = (misses[k] for k in (NUMPY, UNIFORM, ACCMER))
            line += "  " + ", ".join("-" if c is None else f"{c:,.0f}" for c in counts)
        lines.append(line)
    return "\n".join(lines)
