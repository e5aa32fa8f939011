"""How summaries, ``mpirl info`` and ``mpirl watch`` print numbers: one place, so every algorithm's page reads
the same."""

from __future__ import annotations

import math
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
