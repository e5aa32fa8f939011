"""``mpirl watch RUN_DIR``: a live view of a running job, from its HDF5 files alone.

Every ``interval`` seconds the run's files are read (read-only, without locks,
as the job writes them) and one screen is drawn: a progress bar toward each stop
condition, the learner's rates and compute/communication split, each buffer's
fill and alpha (experiences generated / consumed), each actor's steps per
second and returns. It ends by itself when the run reaches a final status.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from mpirl.metrics.run_file import FINAL_STATUSES
from mpirl.metrics.formatting import fmt


def progress(s: dict[str, Any]) -> list[tuple[str, float, str]]:
    """``(what, fraction done in [0, 1], detail)`` for each stop condition the job has."""
    job, L = s["job"], s["learner"] or {}
    out = []
    for key, now, unit in (("run.train_steps", L.get("train_steps"), "train steps"),
                           ("run.env_steps", L.get("env_steps"), "env steps"),
                           ("run.wall_seconds", s.get("elapsed_seconds"), "s")):
        goal = job.get(key) or 0
        if goal:
            done = float(now or 0)
            out.append((key.split(".")[1], min(done / goal, 1.0), f"{fmt(done)} / {fmt(goal)} {unit}"))
    target = job.get("run.target_return")
    if isinstance(target, (int, float)) and math.isfinite(target) and target:
        ret = L.get("return_mean20")
        frac = 0.0 if ret is None or not math.isfinite(ret) else max(0.0, min(ret / target, 1.0))
        window = job.get("run.return_window", 20)
        out.append(("target_return", frac, f"mean of the last {window}: {fmt(ret, ',.1f')} / {fmt(target, ',.1f')}"))
    return out


def bar(fraction: float, width: int = 30) -> str:
    full = int(round(fraction * width))
    return "[" + "#" * full + "." * (width - full) + f"] {100 * fraction:5.1f} %"


def frame(s: dict[str, Any]) -> str:
    """One screen of the live view."""
    st = s["status"] + (f" ({s['stop_reason']})" if s.get("stop_reason") else "")
    out = [f"mpirl watch  {s.get('name') or '-'}   {s['run_dir']}",
           f"status {st}   job time {fmt(s.get('elapsed_seconds'), ',.1f', ' s')}   "
           f"{s['roles']['buffers']} buffer(s), {s['roles']['actors']} actors, {s.get('architecture') or '-'}", ""]
    for what, frac, detail in progress(s):
        out.append(f"  {what:<14} {bar(frac)}  {detail}")
    L = s["learner"]
    out.append("")
    if L is None:
        out.append("learner   no rows yet")
    else:
        out += [f"learner   {fmt(L['train_steps'])} train steps, {fmt(L['train_steps_per_s_recent'], ',.1f')} /s recent"
                f"   loss {fmt(L['loss'], '.4g')}   return (last 20) {fmt(L['return_mean20'], ',.1f')}",
                f"          compute {fmt(100 * L['compute_fraction'], '.1f', ' %')} / comm "
                f"{fmt(100 * L['comm_fraction'], '.1f', ' %')}   env steps {fmt(L['env_steps'])}"
                f"   skipped batches {fmt(L.get('skipped_batches'))}"]
    for b in s["buffers"]:
        out.append(f"{b['name']:<9} fill {fmt(b['fill'])}/{fmt(b['capacity'])} "
                   f"({fmt(100 * b['fill_fraction'], '.0f', '%')})   {fmt(b['experiences_in_per_s'], ',.0f')} exp/s"
                   f"   alpha {fmt(b['alpha'], '.2f')}   stale {fmt(b['stale_updates'])}")
    for a in s["actors"]:
        out.append(f"actor {a['actor']:<3} {fmt(a['env_steps_per_s'], ',.0f'):>7} steps/s   env steps "
                   f"{fmt(a['env_steps'])}   eps {fmt(a['epsilon'], '.3f')}   return (last 20) "
                   f"{fmt(a.get('last20_mean'), ',.1f')}   env errors {fmt(a.get('env_errors'))}")
    out += [f"note      {n}" for n in s["notes"]]
    return "\n".join(out)


def watch(run_dir: Path, summarize_fn: Callable[[Path], dict[str, Any]], frame_fn: Callable[[dict[str, Any]], str],
          interval: float = 2.0, once: bool = False, stream: TextIO = sys.stdout) -> int:
    """Draw frames until the run ends (or once); returns 0. ``summarize_fn``/``frame_fn``: the run's algorithm's
    view (its ``info`` module's ``summarize`` and ``frame``; :func:`frame` is the learner-buffer-actor one)."""
    clear = "\x1b[H\x1b[2J" if stream.isatty() and not once else ""
    while True:
        s = summarize_fn(run_dir)
        stream.write(clear + frame_fn(s) + "\n" + ("" if clear else "\n"))
        stream.flush()
        if once or s["status"] in (*FINAL_STATUSES, "dead"):
            return 0
        time.sleep(interval)
