"""``updates.h5``: what the rank that applies the updates writes (the server; rank 0 under ``allreduce``).

* ``updates``: a row per gradient the server received (``async``: applied or dropped, its staleness), per round
  (``sync``: the gradients averaged, the drops since the last round) or per update (``allreduce``: rank 0's own
  gradient's statistics, the norm of the average). ``dropped`` and ``env_steps`` are the job's totals then.
* ``test``: the final policy's test round (the family's ``test_episodes`` games, the builder's
  :meth:`~mpirl.gradients.builder.GradientBuilder.play_test`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from mpirl.agents.sampling import uniform_entropy
from mpirl.agents.test_play import TEST_COLUMNS
from mpirl.gradients.messages import STATS
from mpirl.metrics.writer import MetricsFile, Rows

if TYPE_CHECKING:
    from mpirl.gradients.builder import GradientBuilder, GradientModel

F8, I8 = np.float64, np.int64
UPDATES = {"time": F8, "version": I8, "worker": np.int32, "gradients": I8, "staleness": F8, "applied": np.bool_,
           "dropped": I8, "env_steps": I8, "applied_norm": F8, **{s: F8 for s in STATS}}

UNITS = {"time": "s", "compute_s": "s", "seconds": "s"}


class UpdateLog:
    def __init__(self, ctx, builder: GradientBuilder, n_params: int, attrs: dict):
        self.ctx, self.builder = ctx, builder
        action = getattr(ctx.spaces, "action", None)  # the entropy info flags a collapse against
        uniform = uniform_entropy(action) if action is not None else float("nan")
        self.file = MetricsFile(ctx.run_dir / "updates.h5", {"rank": ctx.topo.rank, "n_params": n_params,
                                                             "uniform_entropy": uniform, **attrs},
                                flush_seconds=ctx.cfg.log.flush_seconds, resume=bool(ctx.resume))
        self.updates = Rows(self.file.table("updates", UPDATES, UNITS))
        self.test_table = self.file.table("test", TEST_COLUMNS, UNITS)
        if ctx.resume:
            for t in (self.updates.table, self.test_table):
                t.truncate(t.rows_until("time", ctx.resume.job_time))

    def add(self, **row) -> None:
        self.updates.add(time=self.ctx.now(), **row)

    def flush_if_due(self) -> None:
        if self.file.flush_due():
            self.updates.write()
            self.file.flush()

    def test(self, model: GradientModel, version: int, env_steps: int) -> None:
        n = self.builder.settings(self.ctx.cfg).test_episodes
        if not n:
            return
        t0 = time.perf_counter()
        played = self.builder.play_test(model, self.ctx, n, self.ctx.seed() + 1_000_003 + version)
        self.test_table.append(time=self.ctx.now(), train_steps=version, env_steps=env_steps, **played,
                               seconds=time.perf_counter() - t0)

    def close(self) -> None:
        self.updates.write()
        self.file.close()
