"""``mpirl info`` for a QMIX run: the shared summary (status, buffers, episodes, actors) plus QMIX's
learner stats and its greedy test rounds."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from mpirl.metrics import summary as shared
from mpirl.metrics.formatting import fmt
from mpirl.metrics.watch import frame as star_frame

STATS = ("loss", "td_abs", "q_tot", "central_loss", "w_mean_raw", "f_mean", "grad_norm")


def summarize(run_dir: Path) -> dict[str, Any]:
    s = shared.summarize(run_dir)
    learner = Path(run_dir) / "learner.h5"
    train, test = shared.read_table(learner, "train"), shared.read_table(learner, "test")
    q: dict[str, Any] = {k: shared._tail_mean(train, k) for k in STATS}
    for k in ("sample_s", "train_s", "test_s"):
        q[k] = shared._last(train, k)
    q["sampling_share"] = shared._ratio(q["sample_s"], (q["sample_s"] or 0) + (q["train_s"] or 0))
    rows = len(test.get("time", ()))
    q["tests"] = rows
    q["test"] = ({k: shared._last(test, k) for k in ("train_steps", "return_mean", "return_std", "captures",
                                                     "lone_catches", "length", "episodes")} if rows else None)
    q["best_test_return"] = float(np.max(test["return_mean"])) if rows else math.nan
    s["qmix"] = q
    return s


def format_summary(s: dict[str, Any]) -> str:
    job = s.get("job", {})
    variant = {("none", "uniform"): "QMIX", ("macpo", "uniform"): "MAC-PO", ("macpo", "accmer"): "AccMER"}.get(
        (job.get("qmix.loss_weights"), job.get("qmix.sampler", job.get("replay.sampler"))), "QMIX")  # older runs: replay.*
    q = s["qmix"]
    out = [shared.format_summary(s), "",
           f"{variant:<13} on {job.get('env.id', '-')}",
           f"  loss / |TD| / Q_tot (last 10%)   {fmt(q['loss'], '.4g')} / {fmt(q['td_abs'], '.4g')} / "
           f"{fmt(q['q_tot'], '.4g')}",
           f"  MAC-PO w raw / f(pi) / central   {fmt(q['w_mean_raw'], '.4g')} / {fmt(q['f_mean'], '.4g')} / "
           f"{fmt(q['central_loss'], '.4g')}",
           f"  sampling / training / testing    {fmt(q['sample_s'], ',.1f', ' s')} / {fmt(q['train_s'], ',.1f', ' s')}"
           f" / {fmt(q['test_s'], ',.1f', ' s')}   (sampling share {fmt(100 * q['sampling_share'], '.1f', ' %')})"]
    t = q["test"]
    if t:
        out.append(f"  greedy test ({fmt(t['episodes'])} episodes at train step {fmt(t['train_steps'])}): return "
                   f"{fmt(t['return_mean'], ',.2f')} ± {fmt(t['return_std'], ',.2f')}, captures "
                   f"{fmt(t['captures'], ',.2f')}, lone catches {fmt(t['lone_catches'], ',.2f')}, length "
                   f"{fmt(t['length'], ',.1f')}; best round {fmt(q['best_test_return'], ',.2f')} of {q['tests']}")
    else:
        out.append("  greedy test   no rounds yet")
    return "\n".join(out)


def frame(s: dict[str, Any]) -> str:
    """``mpirl watch``: the learner-buffer-actor frame, then QMIX's greedy tests."""
    q, t = s["qmix"], s["qmix"]["test"]
    tests = (f"greedy test   {fmt(q['tests'])} round(s), last at train step {fmt(t['train_steps'])}: return "
             f"{fmt(t['return_mean'], ',.2f')}" if t else "greedy test   none yet")
    return star_frame(s) + "\n" + tests
