"""How summaries, ``mpirl info`` and ``mpirl watch`` print numbers: one place, so every algorithm's page reads
the same."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def fmt(x: Any, spec: str = ",.0f", unit: str = "") -> str:
    """Format a number; '-' for None/NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:{spec}}{unit}" if isinstance(x, (int, float)) else str(x)


def fmt_bytes(x: Any) -> str:
    """A byte count in B, KiB, MiB or GiB; '-' for None/NaN."""
    if x is None or not math.isfinite(x):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(x) < 1024 or unit == "GiB":
            return f"{x:,.0f} {unit}" if unit == "B" else f"{x:,.1f} {unit}"
        x /= 1024


def table(columns: Sequence[tuple[str, int]], rows: Iterable[Sequence[str]], indent: str = "  ") -> list[str]:
    """A table's lines: its columns' names, then one line per row of cells already formatted, each cell right-aligned
    to its column's width and the cells one space apart."""
    def line(cells: Sequence[str]) -> str:
        return indent + " ".join(f"{cell:>{width}}" for cell, (_, width) in zip(cells, columns, strict=True))
    return [line([name for name, _ in columns])] + [line(row) for row in rows]


COLLAPSED = 0.05  # a categorical policy's entropy under this share of the uniform policy's: it plays one action


def collapse_note(entropy: float, uniform: float, fix: str) -> str:
    """'' for a policy still exploring; else a note that its entropy fell under :data:`COLLAPSED` of the uniform
    policy's (``uniform``: nan for a Gaussian policy, never flagged) and what to try (``fix``)."""
    if not (math.isfinite(entropy) and math.isfinite(uniform) and uniform > 0) or entropy >= COLLAPSED * uniform:
        return ""
    return (f"the policy's entropy is {entropy:.2g}, under {COLLAPSED:.0%} of a uniform policy's {uniform:.3g}: it "
            f"plays nearly one action everywhere and explores no more; if the returns are still low, {fix}")
