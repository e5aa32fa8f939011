"""When a central loop stops, and why; when a checkpoint is due.

Every central loop (the learner of the actor → buffer → learner family, the gradient family's parameter server
or its allreduce peers, the tabular Q-server) asks this one place, so the stop conditions of ``[run]`` (a
preemption signal, train steps, env steps, wall time, a target mean return over the last ``run.return_window``
episodes) and the cadence of ``[checkpoint]`` mean the same in every algorithm, and so does the stop reason a run
writes.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Collection

import numpy as np

from mpirl.job.preemption import PREEMPTED, signal_name

if TYPE_CHECKING:
    from mpirl.job.context import RoleContext

_ASK = object()  # stop_reason's default notice: ask the job's preemption


class RunControl:
    """The stop rule and the checkpoint cadence of one central loop.

    ``whose``: what the returns counted are, when not every episode's (``" of actor 3"``), for the reason text.
    ``from_last``: ``checkpoint.every_steps`` counts from the last checkpoint (or from the start) rather than at its
    multiples: for a loop whose steps advance by more than one between two asks (a multiple would go by unseen)."""

    def __init__(self, ctx: RoleContext, whose: str = "", *, from_last: bool = False):
        self.run, self.every = ctx.cfg.run, ctx.cfg.checkpoint
        self.preempt, self.topo = ctx.preempt, ctx.topo
        self.whose, self.from_last = whose, from_last
        self.started = self.last_save = time.perf_counter()
        self.saved_at = -1  # the steps of the last checkpoint (none yet)

    def elapsed(self) -> float:
        """Seconds since this loop started (the wall the ``run.wall_seconds`` condition counts)."""
        return time.perf_counter() - self.started

    def resumed(self, elapsed: float) -> None:
        """A loop resumed from a checkpoint taken ``elapsed`` seconds into the run: :meth:`elapsed` (and with it
        ``run.wall_seconds``) counts on from there."""
        self.started = time.perf_counter() - elapsed

    def preempted(self, notice: tuple[int, int]) -> str:
        """The stop reason of a preemption ``notice`` (rank, signal)."""
        rank, signum = notice
        return f"{PREEMPTED}: {signal_name(signum)} on rank {rank} ({self.topo.role_of(rank)})"

    def stop_reason(self, *, train_steps: int = 0, env_steps: int = 0, returns: Collection[float] = (),
                    wall: bool = True, notice=_ASK) -> str:
        """Why the loop stops now ('' if it goes on). ``notice``: a preemption already seen (``None``: none; by
        default the job's preemption is asked); ``wall``: test the wall clock (a loop whose lead tests it for
        every peer passes False elsewhere); ``returns``: the last episodes' returns, at most the window."""
        r = self.run
        if notice is _ASK:
            notice = self.preempt.requested() if self.preempt is not None else None
        if notice:
            return self.preempted(notice)
        if r.train_steps and train_steps >= r.train_steps:
            return f"train_steps {r.train_steps} reached"
        if r.env_steps and env_steps >= r.env_steps:
            return f"env_steps {r.env_steps} reached"
        if wall and r.wall_seconds and self.elapsed() >= r.wall_seconds:
            return f"wall_seconds {r.wall_seconds:g} reached"
        if (not math.isnan(r.target_return) and len(returns) >= r.return_window
                and float(np.mean(list(returns))) >= r.target_return):
            return (f"mean return of the last {r.return_window} episodes{self.whose} "
                    f"reached {r.target_return:g}")
        return ""

    def checkpoint_due(self, steps: int) -> bool:
        """A checkpoint is due at ``steps``: a multiple of ``checkpoint.every_steps`` not yet saved (``from_last``:
        that many steps since the last one), or ``checkpoint.every_seconds`` since the last one (or since the start)."""
        c = self.every
        if steps == self.saved_at:
            return False
        if c.every_steps and (steps - max(self.saved_at, 0) >= c.every_steps if self.from_last
                              else steps % c.every_steps == 0 and steps > 0):
            return True
        return bool(c.every_seconds and time.perf_counter() - self.last_save >= c.every_seconds)

    def saved(self, steps: int) -> None:
        """A checkpoint at ``steps`` was written (or resumed from)."""
        self.saved_at, self.last_save = steps, time.perf_counter()
