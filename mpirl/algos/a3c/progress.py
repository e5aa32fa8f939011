"""The job's progress as the rank that applies updates sees it (the server, or rank 0 and every peer under
``allreduce``): updates, each worker's env steps and episodes, the last ``run.return_window`` returns; the stop
conditions of ``[run]``; and the checkpoint (``checkpoints/ckpt-<updates>.pt``: the model and optimizer, these
counters, the job time).

Workers hold nothing a checkpoint needs besides their counters, which it carries: a resumed worker starts new
games with the checkpoint's parameters (from the server's first reply, or from the file under ``allreduce``).
"""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np

from mpirl.job import checkpoint as ckpt
from mpirl.job.preemption import PREEMPTED, signal_name


class Progress:
    def __init__(self, ctx, workers: list[int]):
        self.ctx, self.cfg = ctx, ctx.cfg
        self.version = 0  # updates applied
        self.env_steps = dict.fromkeys(workers, 0)
        self.episodes = dict.fromkeys(workers, 0)
        self.returns: deque = deque(maxlen=ctx.cfg.run.return_window)
        self.dropped = 0
        self.started = time.perf_counter()
        self.last_save = time.perf_counter()
        self.saved_at = 0  # the version of the last checkpoint

    def note(self, worker: int, env_steps: int, episodes: int, returns) -> None:
        self.env_steps[worker], self.episodes[worker] = env_steps, episodes
        self.returns.extend(float(r) for r in returns)

    @property
    def total_env_steps(self) -> int:
        return sum(self.env_steps.values())

    def stop_reason(self, notice: tuple[int, int] | None, wall: bool = True) -> str:
        """Why the job stops now ('' if it goes on). ``notice``: a preemption seen; ``wall``: test the wall clock
        (under ``allreduce`` only rank 0 does, and tells the others)."""
        r = self.cfg.run
        if notice is not None:
            rank, signum = notice
            return f"{PREEMPTED}: {signal_name(signum)} on rank {rank} ({self.ctx.topo.role_of(rank)})"
        if r.train_steps and self.version >= r.train_steps:
            return f"train_steps {r.train_steps} reached"
        if r.env_steps and self.total_env_steps >= r.env_steps:
            return f"env_steps {r.env_steps} reached"
        if (not math.isnan(r.target_return) and len(self.returns) == self.returns.maxlen
                and np.mean(self.returns) >= r.target_return):
            return f"mean return of the last {r.return_window} episodes reached {r.target_return:g}"
        if wall and r.wall_seconds and time.perf_counter() - self.started >= r.wall_seconds:
            return f"wall_seconds {r.wall_seconds:g} reached"
        return ""

    def save_due(self) -> bool:
        c = self.cfg.checkpoint
        if self.version == self.saved_at:
            return False
        return bool((c.every_steps and self.version - self.saved_at >= c.every_steps)
                    or (c.every_seconds and time.perf_counter() - self.last_save >= c.every_seconds))

    def save(self, model, world_size: int) -> None:
        ckpt.save(self.ctx.run_dir, {"train_steps": self.version, "job_time": self.ctx.now(),
                                     "identity": ckpt.identity(self.cfg, world_size), "model": model.state(),
                                     "env_steps": dict(self.env_steps), "episodes": dict(self.episodes),
                                     "returns": list(self.returns), "dropped": self.dropped},
                  self.cfg.checkpoint.keep)
        self.saved_at, self.last_save = self.version, time.perf_counter()

    def restore(self, model) -> None:
        """From the checkpoint being resumed (``ctx.resume``)."""
        st = ckpt.load(self.ctx.resume.checkpoint, map_location=model.device)
        model.restore(st["model"])
        self.version = self.saved_at = int(st["train_steps"])
        self.env_steps.update({int(k): int(v) for k, v in st["env_steps"].items()})
        self.episodes.update({int(k): int(v) for k, v in st["episodes"].items()})
        self.returns.extend(st["returns"])
        self.dropped = int(st["dropped"])
