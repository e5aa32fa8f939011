"""Schedules of the actor-critics' settings over a run: the learning rate, the entropy coefficient and PPO's clip
range each go linearly from their setting to their ``*_final`` value over the first ``agent.schedule_steps`` of the
run (counted in ``agent.schedule_unit``: env steps or train steps), then stay there; a ``*_final`` of nan keeps the
setting constant. (SB3's and CleanRL's annealed learning rate is ``lr_final = 0`` over the whole run.) Pure."""

from __future__ import annotations

import math


class Linear:
    """``start`` at 0, ``end`` at ``horizon`` and after; ``end`` nan: always ``start``."""

    def __init__(self, start: float, end: float, horizon: float):
        self.start, self.end, self.horizon = float(start), float(end), float(horizon)
        self.constant = math.isnan(self.end) or self.horizon <= 0

    def __call__(self, progress: float) -> float:
        if self.constant:
            return self.start
        f = min(max(progress / self.horizon, 0.0), 1.0)
        return self.start + f * (self.end - self.start)


def horizon(cfg) -> int:
    """The schedules' length in ``agent.schedule_unit``: ``agent.schedule_steps``, or (0) the run's limit in that
    unit (``run.env_steps`` or ``run.train_steps``; 0 when the run has none, which the checks refuse for a
    schedule that moves)."""
    a = cfg.agent
    return int(a.schedule_steps or getattr(cfg.run, a.schedule_unit))


def progress_of(cfg, train_steps: int, env_steps: int) -> float:
    """Where the run is, in ``agent.schedule_unit``."""
    return float(env_steps if cfg.agent.schedule_unit == "env_steps" else train_steps)


def scheduled(cfg, names: dict[str, tuple[float, float]]) -> dict[str, Linear]:
    """``name -> Linear(start, final, horizon)`` for each ``name: (start, final)``."""
    h = horizon(cfg)
    return {name: Linear(start, final, h) for name, (start, final) in names.items()}
