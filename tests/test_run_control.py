"""The one stop rule and checkpoint cadence every central loop asks (mpirl/job/run_control.py), without MPI: each
condition of [run] stops with its reason, a preemption comes first, and checkpoints fall where [checkpoint] says."""

from __future__ import annotations

import math
import signal
from types import SimpleNamespace

from mpirl.config import JobConfig
from mpirl.job import run_control
from mpirl.job.run_control import RunControl


class Topo:
    def role_of(self, rank: int) -> str:
        return {0: "learner", 3: "actor"}[rank]


def control(whose: str = "", from_last: bool = False, **run) -> tuple[RunControl, JobConfig]:
    cfg = JobConfig()
    cfg.run.train_steps, cfg.run.env_steps, cfg.run.wall_seconds = 0, 0, 0.0
    cfg.run.target_return = math.nan
    for key, value in run.items():
        setattr(cfg.run, key, value) if hasattr(cfg.run, key) else setattr(cfg.checkpoint, key, value)
    ctx = SimpleNamespace(cfg=cfg, topo=Topo(), preempt=None)
    return RunControl(ctx, whose, from_last=from_last), cfg  # type: ignore[arg-type]


def test_each_stop_condition_gives_its_reason_and_nothing_stops_short_of_it():
    rc, _ = control(train_steps=10)
    assert rc.stop_reason(train_steps=9) == "" and rc.stop_reason(train_steps=10) == "train_steps 10 reached"
    rc, _ = control(env_steps=500)
    assert rc.stop_reason(env_steps=499) == "" and rc.stop_reason(env_steps=500) == "env_steps 500 reached"
    rc, _ = control(target_return=195.0, return_window=3)
    assert rc.stop_reason(returns=[200.0, 200.0]) == ""  # the window is not full yet
    assert rc.stop_reason(returns=[200.0, 190.0, 180.0]) == ""
    assert rc.stop_reason(returns=[200.0, 195.0, 190.0]) == "mean return of the last 3 episodes reached 195"
    rc, _ = control(" of actor 3", target_return=1.0, return_window=1)
    assert rc.stop_reason(returns=[2.0]) == "mean return of the last 1 episodes of actor 3 reached 1"


def test_the_wall_counts_from_the_start_or_from_where_a_resumed_run_was():
    rc, _ = control(wall_seconds=100.0)
    assert rc.stop_reason() == ""
    rc.resumed(100.5)  # the checkpoint was taken 100.5 s into the run
    assert rc.stop_reason() == "wall_seconds 100 reached"
    assert rc.stop_reason(wall=False) == ""  # a peer whose lead tests the wall for it


def test_a_preemption_comes_before_every_other_condition():
    rc, _ = control(train_steps=1)
    assert rc.stop_reason(train_steps=5, notice=(3, signal.SIGTERM)) == "preempted: SIGTERM on rank 3 (actor)"
    assert rc.stop_reason(train_steps=5, notice=None) == "train_steps 1 reached"


def test_checkpoints_fall_on_multiples_or_every_n_from_the_last():
    rc, _ = control(every_steps=100, every_seconds=0.0)
    rc.saved(0)
    assert [s for s in (50, 100, 150, 200, 250) if rc.checkpoint_due(s)] == [100, 200]
    rc.saved(200)
    assert not rc.checkpoint_due(200)  # never twice at one step
    rc, _ = control(from_last=True, every_steps=100, every_seconds=0.0)
    rc.saved(0)
    assert not rc.checkpoint_due(99) and rc.checkpoint_due(103)  # steps that jump past a multiple still count
    rc.saved(103)
    assert not rc.checkpoint_due(200) and rc.checkpoint_due(203)


def test_a_checkpoint_is_due_after_every_seconds_but_not_twice_at_one_step(monkeypatch):
    """The cadence is a wall clock: the module's clock is set by hand, so how long the machine takes between two
    lines (a loaded machine can take more than the cadence) cannot decide the answer."""
    now = [1000.0]
    monkeypatch.setattr(run_control, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    rc, _ = control(every_steps=0, every_seconds=0.5)
    rc.saved(7)
    now[0] += 0.375  # (sums of halves: exact in binary)
    assert not rc.checkpoint_due(8)
    now[0] += 0.125
    assert rc.checkpoint_due(8) and not rc.checkpoint_due(7)
    rc.saved(8)
    now[0] += 0.375
    assert not rc.checkpoint_due(9)  # counted from the last checkpoint, not from the start
