"""What every benchmark shares: repeated timing, side-by-side rows with ratios, HDF5 output.

A benchmark measures *ours* and a *reference* in the same process run, one after
the other, several repetitions each, and reports the median with min–max. A
:class:`Row` holds the repetitions of one quantity for every implementation; the
ratio is ours over the reference (``higher_is_better``) or its inverse, so a
ratio above 1 is always "ours is better". Numbers go to an HDF5 file (one group
per benchmark, one dataset of repetitions per row and implementation) next to the
machine they came from.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

MIN_REPS = 5


def rate(op: Callable[[], object], per_call: float, reps: int = MIN_REPS, seconds: float = 0.3,
         setup: Callable[[], object] | None = None) -> list[float]:
    """``reps`` measurements of ``per_call * calls / second`` of ``op``.

    Each repetition calls ``op`` until ``seconds`` have passed (at least 3 calls)
    after one untimed warm-up call; ``setup`` (untimed) runs before each repetition.
    """
    out = []
    op()
    for _ in range(reps):
        if setup is not None:
            setup()
        calls, start = 0, time.perf_counter()
        while True:
            op()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds and calls >= 3:
                break
        out.append(per_call * calls / elapsed)
    return out


@dataclass
class Row:
    """One measured quantity: repetitions per implementation, ours against ``reference``."""
    name: str
    unit: str
    ours: str
    reference: str
    values: dict[str, list[float]] = field(default_factory=dict)
    higher_is_better: bool = True
    target: float | None = None  # the ratio the issue asks for, if any
    note: str = ""
    at_most: float | None = None  # an absolute bound on ours (median), e.g. bytes per slot or a time share
    within: float | None = None  # the ratio asked to lie within 1 +- this (a model against a measurement)

    def median(self, impl: str) -> float:
        v = self.values.get(impl)
        return statistics.median(v) if v else float("nan")

    @property
    def ratio(self) -> float:
        """Ours over the reference (inverted when lower is better): > 1 means ours is better.

        Infinite medians (a threshold never reached) compare as such: inf / finite is
        infinitely better, anything / inf infinitely worse, inf / inf undefined (nan).
        """
        a, b = self.median(self.ours), self.median(self.reference)
        if not self.higher_is_better:
            a, b = b, a
        if not (a > 0 and b > 0) or (np.isinf(a) and np.isinf(b)):
            return float("nan")
        return a / b

    @property
    def met(self) -> bool | None:
        if self.at_most is not None:
            return bool(self.median(self.ours) <= self.at_most)
        if self.within is not None:
            return None if np.isnan(self.ratio) else bool(abs(self.ratio - 1) <= self.within)
        if self.target is None or np.isnan(self.ratio):
            return None
        return self.ratio >= self.target  # inf (only ours reached it) meets any target, 0 none

    @property
    def ratio_text(self) -> str:
        """The ratio for a table: "-" when undefined, "inf" when only ours reached a threshold."""
        return "inf" if self.ratio == np.inf else _fmt(self.ratio)


def _fmt(x: float) -> str:
    if np.isinf(x):
        return "not reached" if x > 0 else "-"
    if not np.isfinite(x):
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def format_rows(title: str, rows: list[Row]) -> str:
    """A table: per row, each implementation's median [min–max], and the ratio against its target."""
    lines = [title]
    for r in rows:
        lines.append(f"  {r.name} [{r.unit}]")
        for impl, v in r.values.items():
            lines.append(f"    {impl:34s} {_fmt(statistics.median(v)):>12s}   [{_fmt(min(v))} – {_fmt(max(v))}]  "
                         f"n={len(v)}")
        if r.ours == r.reference:  # a quantity told side by side, not compared: no ratio of a side with itself
            if r.note:
                lines.append(f"    ({r.note})")
            continue
        verdict = ""
        if r.target is not None:
            verdict = f"  target >= {r.target:g}x: {'met' if r.met else 'MISSED'}"
        if r.at_most is not None:
            verdict = f"  target: {r.ours} <= {_fmt(r.at_most)} {r.unit}: {'met' if r.met else 'MISSED'}"
        if r.within is not None:
            verdict = f"  target: within {100 * r.within:g} %: {'met' if r.met else 'MISSED'}"
        lines.append(f"    {'ratio ' + r.ours + ' / ' + r.reference:34s} {r.ratio_text:>12s}x{verdict}"
                     + (f"  ({r.note})" if r.note else ""))
    return "\n".join(lines)


def cores_note(ranks: int) -> str:
    """How ``ranks`` ranks sit on this machine's cores, for a row's note: "oversubscribed: ..." beyond them."""
    cores = os.cpu_count() or 1
    text = f"{ranks} rank{'s' if ranks > 1 else ''} on {cores} core{'s' if cores > 1 else ''}"
    return f"oversubscribed: {text}" if ranks > cores else text


def machine() -> dict:
    """Where the numbers came from."""
    import torch
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return {"host": platform.node(), "cpu": model, "cores": cpus, "memory_gb": round(mem / 2**30, 1),
            "python": platform.python_version(), "numpy": np.__version__, "torch": str(torch.__version__),
            "system": f"{platform.system()} {platform.release()}",
            "time": dt.datetime.now().astimezone().isoformat(timespec="seconds")}


def write_rows(path: Path, bench: str, rows: list[Row], attrs: dict | None = None) -> None:
    """Append (replace) group ``bench`` of ``path``: per row a group with one dataset per implementation."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "a") as f:
        if bench in f:
            del f[bench]
        g = f.create_group(bench)
        for k, v in {**machine(), **(attrs or {})}.items():
            g.attrs[k] = v
        for r in rows:
            rg = g.create_group(r.name)
            rg.attrs.update(unit=r.unit, ours=r.ours, reference=r.reference, ratio=r.ratio,
                            higher_is_better=r.higher_is_better, note=r.note,
                            target=np.nan if r.target is None else r.target,
                            at_most=np.nan if r.at_most is None else r.at_most,
                            within=np.nan if r.within is None else r.within, met=str(r.met))
            for impl, v in r.values.items():
                rg.create_dataset(impl, data=np.asarray(v, dtype=np.float64))
