"""Seeds together: runs of one job that differ in their seed, side by side (``mpirl compare``).

Runs are grouped by their job settings without the seed and the keys the caller names, each group's curve the
median of its runs with their interquartile band, its final values summarised by their IQM with a bootstrap
interval: :mod:`mpirl.metrics.seed_groups`. This module draws them (one PNG) and tabulates them.

What is compared (``y``) against what (``x``): :mod:`mpirl.metrics.run_curves`, which reads each run's curve.

Runs of different length (a run that stops at its target return ends early) are cut to the shortest in a group's
median: the part past it is drawn per run, faint, with no median. Final values: per group its runs', their median,
their IQM and its interval.

Bad input raises :class:`~mpirl.domain.ConfigError` (the command prints one line, exit 2): a path without any
``run.h5``, an output file that exists (without ``force``), an unknown column or one some runs lack, an x axis
some runs have no counter for. A run that cannot be read, or has no returns (or rows) yet, is skipped with a note:
a directory of runs may hold one just starting or broken, and the others still compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from mpirl.atomic import check_target
from mpirl.domain import ConfigError
from mpirl.metrics.run_curves import TAIL, Run, read_runs
from mpirl.metrics.seed_groups import RESAMPLES, SEED_KEYS, Group, group_runs, iqm, iqm_interval  # noqa: F401

X_LABELS = {"env_steps": "env steps (summed over all actors or workers)", "train_steps": "train steps",
            "time": "wall time since the job started [s]"}
INSTALL = "pip install 'mpirl[analysis]'"


@dataclass
class Comparison:
    """What :func:`compare` made: the groups, the table of final values as text, the notes (skipped runs) and the
    PNG written."""
    groups: list[Group]
    table: str
    notes: list[str]
    out: Path


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def y_label(y: str, runs: list[Run]) -> str:
    """The y axis's name: the column in full, or the return with its window."""
    if y != "return":
        return y
    windows = {int(r.job.get("run.return_window") or 20) for r in runs}
    return f"return (mean of the last {windows.pop() if len(windows) == 1 else 'run.return_window'} episodes)"


def draw(groups: list[Group], ylabel: str, x: str, out: Path) -> None:
    """One PNG: per group each run faint, the median over its runs with their interquartile band, n in the legend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, g in enumerate(groups):
        color = f"C{i % 10}"
        for r in g.runs:
            ax.plot(r.x, r.y, color=color, alpha=0.3, lw=0.8)
        ax.plot([r.x[-1] for r in g.runs], [r.y[-1] for r in g.runs], "o", color=color, ms=4, alpha=0.7)
        label = f"{g.label} (n={len(g.runs)})"
        if len(g.runs) == 1:  # its own curve, no band
            ax.plot(g.runs[0].x, g.runs[0].y, color=color, lw=2, label=label)
            continue
        grid, q25, median, q75 = g.band()
        ax.fill_between(grid, q25, q75, color=color, alpha=0.25, lw=0)
        ax.plot(grid, median, color=color, lw=2, label=label if grid.size else f"{label}: runs share no x range")
    ax.set(xlabel=X_LABELS[x], ylabel=ylabel)
    if x != "time":  # counts as 200k, 1.5M
        ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
    ax.set_title("line and band: median and 25-75 % of each group's runs, where all of them have data\n"
                 "faint: each run, a dot at its end", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def format_table(groups: list[Group], y: str, x: str, seed: int) -> str:
    """The final values per group: n, median, IQM, its bootstrap interval, where the runs ended (the median of their
    last x) and every run's value, then what they mean."""
    heads = ("group", "n", "median", "IQM", "95 % CI of IQM", f"ended at ({x})", "each run (seed value)")
    rows = []
    for g in groups:
        finals = [r.final for r in g.runs]
        lo, hi = iqm_interval(finals, seed)
        rows.append((g.label, str(len(finals)), _num(float(np.median(finals))), _num(iqm(finals)),
                     f"[{_num(lo)}, {_num(hi)}]", _num(float(np.median([r.x[-1] for r in g.runs]))),
                     "  ".join(f"s{r.seed} {_num(r.final)}" for r in g.runs)))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in (0, 6) else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    what = (f"{y_label(y, [r for g in groups for r in g.runs])} at each run's end" if y == "return"
            else f"{y}, the mean of each run's last {TAIL:.0%} of points")
    out = [f"final value: {what}; ended at: the median {x} of the runs' last points", line(heads),
           *(line(r) for r in rows),
           f"IQM: the mean of the middle 50 % of a group's runs (n // 4 cut at each end); 95 % CI: percentile "
           f"bootstrap of the IQM, {RESAMPLES:,} resamples of the runs, seed {seed}"]
    if any(len(g.runs) < 4 for g in groups):
        out.append("note: a group of fewer than 4 runs cuts none: its IQM is the mean of its runs"
                   + ("; a lone run's interval is its own value" if any(len(g.runs) == 1 for g in groups) else ""))
    return "\n".join(out)


def check_out(out: Path, force: bool) -> None:
    """The PNG can be written (:func:`mpirl.atomic.check_target`): a ``.png`` name in a writable directory that
    exists, not a directory, new unless ``force``."""
    check_target("--out", out, force, (".png",))


def compare(paths: Sequence[str | Path], y: str = "return", x: str = "env_steps", out: Path = Path("compare.png"),
            force: bool = False, seed: int = 0, ignore: Sequence[str] = SEED_KEYS,
            ignore_sections: Sequence[str] = ()) -> Comparison:
    """Read the runs below ``paths``, group them, draw ``out`` and tabulate the final values (see the module doc).

    ``ignore``: job keys that do not set a group apart (the seed's, and what a resumed job may change);
    ``ignore_sections``: key prefixes likewise (``"log."``). Bad input raises ConfigError before ``out`` is written.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("", f"drawing the comparison needs matplotlib, which is not installed: {INSTALL}") from None
    if x not in X_LABELS:
        raise ConfigError("--x", f"one of {', '.join(X_LABELS)}, got {x!r}")
    check_out(Path(out), force)
    runs, notes, y = read_runs(paths, y, x)
    groups = group_runs(runs, ignore, ignore_sections)
    draw(groups, y_label(y, runs), x, Path(out))
    return Comparison(groups, format_table(groups, y, x, seed), notes, Path(out))
