"""The job's progress as the rank that applies updates sees it (the server, or rank 0 and every peer under
``allreduce``): updates, each worker's env steps and episodes, the last ``run.return_window`` returns; the stop
conditions of ``[run]`` and the checkpoint cadence, asked of its :class:`~mpirl.job.run_control.RunControl` on these
counters; and the checkpoint (``checkpoints/ckpt-<updates>.pt``: the model and optimizer, these counters, the job
time).

Workers hold nothing a checkpoint needs besides their counters, which it carries: a resumed worker starts new
games with the checkpoint's parameters (from the server's first reply, or from the file under ``allreduce``).
"""

from __future__ import annotations

from collections import deque
from functools import partial

from mpirl.job import checkpoint as ckpt
from mpirl.job.run_control import RunControl


class Progress:
    def __init__(self, ctx, workers: list[int]):
        self.ctx, self.cfg = ctx, ctx.cfg
        self.version = 0  # updates applied
        self.env_steps = dict.fromkeys(workers, 0)
        self.episodes = dict.fromkeys(workers, 0)
        self.returns: deque = deque(maxlen=ctx.cfg.run.return_window)
        self.dropped = 0
        # Several updates may come between two asks: checkpoint.every_steps counts from the last checkpoint.
        self.control = RunControl(ctx, from_last=True)
        self.control.saved(0)  # the initial parameters: nothing to save before the first update

    def note(self, worker: int, env_steps: int, episodes: int, returns) -> None:
        self.env_steps[worker], self.episodes[worker] = env_steps, episodes
        self.returns.extend(float(r) for r in returns)

    @property
    def total_env_steps(self) -> int:
        return sum(self.env_steps.values())

    def stop_reason(self, *, ask: bool = True, wall: bool = True) -> str:
        """Why the job stops now ('' if it goes on). ``ask``: ask the job's preemption; ``wall``: test the wall clock
        (under ``allreduce`` only rank 0 does both, and tells the others)."""
        rule = self.control.stop_reason if ask else partial(self.control.stop_reason, notice=None)
        return rule(train_steps=self.version, env_steps=self.total_env_steps, returns=self.returns, wall=wall)

    def save_due(self) -> bool:
        return self.control.checkpoint_due(self.version)

    def save(self, model, world_size: int) -> None:
        ckpt.save(self.ctx.run_dir, {"train_steps": self.version, "job_time": self.ctx.now(),
                                     "identity": ckpt.identity(self.cfg, world_size), "model": model.state(),
                                     "env_steps": dict(self.env_steps), "episodes": dict(self.episodes),
                                     "returns": list(self.returns), "dropped": self.dropped},
                  self.cfg.checkpoint.keep)
        self.control.saved(self.version)

    def restore(self, model) -> None:
        """From the checkpoint being resumed (``ctx.resume``)."""
        st = ckpt.load(self.ctx.resume.checkpoint, map_location=model.device)
        model.restore(st["model"])
        self.version = int(st["train_steps"])
        self.control.saved(self.version)
        self.env_steps.update({int(k): int(v) for k, v in st["env_steps"].items()})
        self.episodes.update({int(k): int(v) for k, v in st["episodes"].items()})
        self.returns.extend(st["returns"])
        self.dropped = int(st["dropped"])
