"""Seeds together: runs of one job that differ in their seed, side by side (``mpirl compare``).

Runs are grouped by their job settings without the seed (``run.seed``, ``run.name``, ``run.out_dir``) and without
the keys the caller names (the command line passes what a resumed job may change: stop limits, ``log.*``,
``checkpoint.*``, the device). A group's label names the settings that differ between the groups
(``replay.architecture=baseline``); a lone group is labelled by its env and algorithm.

What is compared (``y``) against what (``x``): :mod:`mpirl.metrics.run_curves`, which reads each run's curve.

A group's curve is the median over its runs with their interquartile range as a band, on a grid of 200 points
over the x range every run of the group covers. Runs of different length (a run that stops at its target return
ends early) are cut to the shortest: the part past it is drawn per run, faint, with no median.

Final values: per group its runs', their median, their interquartile mean (rliable's IQM, ``scipy.stats.trim_mean(x,
0.25)``: ``n // 4`` runs cut at each end, so with fewer than 4 runs none is cut and the IQM is the mean) and a 95 %
percentile bootstrap interval of the IQM (the runs resampled with replacement by a seeded numpy Generator).

Bad input raises :class:`~mpirl.domain.ConfigError` (the command prints one line, exit 2): a path without any
``run.h5``, an output file that exists (without ``force``), an unknown column or one some runs lack, an x axis
some runs have no counter for. A run that cannot be read, or has no returns (or rows) yet, is skipped with a note:
a directory of runs may hold one just starting or broken, and the others still compare.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mpirl.domain import ConfigError
from mpirl.metrics.run_curves import TAIL, Run, read_runs

SEED_KEYS = ("run.seed", "run.name", "run.out_dir")  # what tells seeds of one job apart
X_LABELS = {"env_steps": "env steps (summed over all actors or workers)", "train_steps": "train steps",
            "time": "wall time since the job started [s]"}
GRID = 200  # points of a group's median curve
RESAMPLES = 2000  # bootstrap resamples of a group's runs
LABEL_KEYS = 3  # settings named in a group's label at most
INSTALL = "pip install 'mpirl[analysis]'"


@dataclass
class Group:
    """Runs whose jobs differ only in the seed (and the ignored keys); ``label`` names what sets it apart."""
    settings: dict[str, str]
    runs: list[Run] = field(default_factory=list)
    label: str = ""

    def band(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``grid, q25, median, q75`` over the x range every run covers (empty arrays when they share none)."""
        lo, hi = max(r.x[0] for r in self.runs), min(r.x[-1] for r in self.runs)
        if not hi > lo:
            return (np.zeros(0),) * 4
        grid = np.linspace(lo, hi, GRID)
        q25, median, q75 = np.percentile([np.interp(grid, r.x, r.y) for r in self.runs], [25, 50, 75], axis=0)
        return grid, q25, median, q75


@dataclass
class Comparison:
    """What :func:`compare` made: the groups, the table of final values as text, the notes (skipped runs) and the
    PNG written."""
    groups: list[Group]
    table: str
    notes: list[str]
    out: Path


def iqm(values: Sequence[float]) -> float:
    """rliable's interquartile mean: the mean after ``n // 4`` values are cut at each end (the plain mean for
    fewer than 4 values), as ``scipy.stats.trim_mean(values, 0.25)``."""
    x = np.sort(np.asarray(values, float))
    k = len(x) // 4
    return float(x[k:len(x) - k].mean())


def iqm_interval(values: Sequence[float], seed: int, resamples: int = RESAMPLES,
                 level: float = 0.95) -> tuple[float, float]:
    """A ``level`` percentile bootstrap interval of the IQM: ``resamples`` draws of ``n`` values with replacement
    (one ``resamples x n`` matrix from ``np.random.default_rng(seed)``), the IQM of each, its percentiles."""
    x = np.asarray(values, float)
    n, k = len(x), len(x) // 4
    draws = np.sort(x[np.random.default_rng(seed).integers(0, n, size=(resamples, n))], axis=1)
    lo, hi = np.percentile(draws[:, k:n - k].mean(axis=1), [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def group_runs(runs: list[Run], ignore: Sequence[str] = SEED_KEYS, ignore_sections: Sequence[str] = ()) -> list[Group]:
    """Runs grouped by their settings but ``ignore`` (keys) and ``ignore_sections`` (key prefixes), labelled."""
    groups: dict[tuple, Group] = {}
    for run in sorted(runs, key=lambda r: (r.seed, str(r.path))):
        settings = {k: repr(v) for k, v in sorted(run.job.items())
                    if k not in ignore and not k.startswith(tuple(ignore_sections))}
        groups.setdefault(tuple(settings.items()), Group(settings)).runs.append(run)
    out = list(groups.values())
    for g, label in zip(out, _labels(out)):
        g.label = label
    return sorted(out, key=lambda g: g.label)


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _labels(groups: list[Group]) -> list[str]:
    """Each group's settings that differ between the groups (``agent.algorithm`` first; keys only some groups have
    go unnamed when the algorithm differs: they follow from it); a lone group: its env and algorithm."""
    if len(groups) == 1:
        job = groups[0].runs[0].job
        return [f"{job.get('env.id', '?')} {job.get('agent.algorithm', '?')}"]
    keys = sorted(set().union(*(g.settings for g in groups)), key=lambda k: (k != "agent.algorithm", k))
    differ = [k for k in keys if len({g.settings.get(k) for g in groups}) > 1]
    if "agent.algorithm" in differ:
        differ = [k for k in differ if k == "agent.algorithm" or all(k in g.settings for g in groups)]
    more = f" (+{len(differ) - LABEL_KEYS} more)" if len(differ) > LABEL_KEYS else ""
    labels = [", ".join(f"{k}={_value(g.runs[0].job.get(k, '-'))}" for k in differ[:LABEL_KEYS]) + more
              for g in groups]
    return [f"{label} #{i + 1}" if labels.count(label) > 1 else label for i, label in enumerate(labels)]


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
    """The PNG can be written: a ``.png`` name in a directory that exists, new unless ``force``."""
    if out.suffix.lower() != ".png":
        raise ConfigError("--out", f"a .png file name, got {str(out)!r}")
    if not out.parent.is_dir():
        raise ConfigError("--out", f"{out.parent} is not a directory; make it first or pass another --out")
    if out.exists() and not force:
        raise ConfigError("--out", f"{out} exists; pass --force to overwrite it, or another --out")


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
