"""Seeds together: runs of one job that differ in their seed, as groups, and the statistics of a group.

Runs are grouped by their job settings without the seed (``run.seed``, ``run.name``, ``run.out_dir``) and without
the keys the caller names (``mpirl compare`` passes what a resumed job may change: stop limits, ``log.*``,
``checkpoint.*``, the device). A group's label names the settings that differ between the groups
(``replay.architecture=baseline``); a lone group is labelled by its env and algorithm.

A group's curve is the median over its runs with their interquartile range as a band, on a grid of :data:`GRID`
points over the x range every run of the group covers. Its final values are summarised by their interquartile mean
(rliable's IQM, ``scipy.stats.trim_mean(x, 0.25)``: ``n // 4`` runs cut at each end, so with fewer than 4 runs none
is cut and the IQM is the mean) and a 95 % percentile bootstrap interval of the IQM (the runs resampled with
replacement by a seeded numpy Generator). Drawn and tabulated by :mod:`mpirl.metrics.compare`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from mpirl.metrics.run_curves import Run

SEED_KEYS = ("run.seed", "run.name", "run.out_dir")  # what tells seeds of one job apart
GRID = 200  # points of a group's median curve
RESAMPLES = 2000  # bootstrap resamples of a group's runs
LABEL_KEYS = 3  # settings named in a group's label at most


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
