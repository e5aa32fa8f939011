"""What a run's summary says that the progress line shows, whatever its algorithm (:class:`Reading`).

The algorithms' summaries (their ``info.summarize``) come in three shapes, one per family: the learner-buffer-actor
one of :mod:`mpirl.metrics.summary` (the learner's last row), the gradient family's ``updates`` and the exchange
family's ``merges``. :func:`reading` takes from each the run's own step and its unit, the env steps, the recent mean
return, the status, and how far along each stop condition that bounds the run is (``run.train_steps``,
``run.env_steps``, ``run.wall_seconds`` as :func:`mpirl.metrics.watch.progress` reads them; DistQL's
``distql.episodes``). The line itself, its rates and the time left: :mod:`mpirl.metrics.progress`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

TIMED = ("train_steps", "env_steps", "wall_seconds")  # the stop conditions whose time left can be told


@dataclass
class Reading:
    """What one summary says that the line shows, whatever the algorithm."""
    unit: str = "steps"  # what the run counts as its step
    steps: float | None = None
    env_steps: float | None = None
    ret: float | None = None  # the recent mean return
    bounds: dict[str, float] = field(default_factory=dict)  # stop condition -> fraction done, 0..1
    status: str = "running"


def number(x: Any) -> float | None:
    """``x`` as a float when it is a finite number, else None."""
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _learner_buffers(s: dict[str, Any]) -> tuple[str, Any, Any, Any, dict[str, float]]:
    """Ape-X, QMIX, IMPALA: the learner's last row."""
    learner = s.get("learner") or {}
    return "train steps", learner.get("train_steps"), learner.get("env_steps"), learner.get("return_mean20"), {}


def _gradients(s: dict[str, Any]) -> tuple[str, Any, Any, Any, dict[str, float]]:
    """The gradient family (``a3c``): updates applied, the workers' steps, the window's mean return."""
    env = sum(w.get("env_steps", 0) for w in s.get("workers", []))
    return "updates", s["updates"].get("version"), env, s.get("episodes", {}).get("last_window"), {}


def _exchange(s: dict[str, Any]) -> tuple[str, Any, Any, Any, dict[str, float]]:
    """The exchange family (``distql``): merges, the workers' steps and last 100 returns, episodes played toward
    every worker's ``distql.episodes``."""
    workers = s.get("workers", [])
    env = sum(w.get("env_steps", 0) for w in workers)
    rets = [r for r in (number(w.get("last100_return")) for w in workers) if r is not None]
    total = int(s.get("job", {}).get("distql.episodes", 0) or 0) * max(len(workers), 1)
    bounds = {"episodes": min(sum(w.get("episodes", 0) for w in workers) / total, 1.0)} if total and workers else {}
    return "merges", s["merges"].get("count"), env, sum(rets) / len(rets) if rets else None, bounds


SHAPES = (("learner", _learner_buffers), ("updates", _gradients), ("merges", _exchange))  # a key its summaries hold


def reading(s: dict[str, Any], elapsed: float | None) -> Reading:
    """What the line shows of summary ``s`` at ``elapsed`` seconds of job time."""
    from mpirl.metrics.watch import progress
    unit, steps, env, ret, bounds = next((read(s) for key, read in SHAPES if key in s), ("steps", None, None, None, {}))
    r = Reading(unit, number(steps), number(env), number(ret), bounds, str(s.get("status", "unknown")))
    # watch.progress reads the stop conditions from the learner's counters: the run's own step stands in for them
    view = {"job": s.get("job", {}), "elapsed_seconds": elapsed,
            "learner": {"train_steps": r.steps, "env_steps": r.env_steps, "return_mean20": r.ret}}
    r.bounds.update((what, frac) for what, frac, _ in progress(view) if what in TIMED)
    return r
