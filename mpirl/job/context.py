"""What every role loop receives: the job, its place in the topology, the run directory."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mpirl.comm.topology import Topology
from mpirl.config import JobConfig

if TYPE_CHECKING:
    from mpirl.job.checkpoint import Resume
    from mpirl.job.preemption import Preemption


@dataclass
class RoleContext:
    cfg: JobConfig
    topo: Topology
    run_dir: Path
    spaces: Any  # the algorithm's record of the env's spaces (what its check found)
    spec: dict  # the record spec: the replay's fields and the experience messages' rows
    n_params: int  # length of the flat parameter vector every broadcast carries
    t0: float  # the job's start (time.time() on rank 0); metric times are seconds since it
    preempt: "Preemption"  # signals -> a clean stop (see job/preemption.py)
    resume: "Resume | None" = None  # set when continuing a run from a checkpoint

    def now(self) -> float:
        return time.time() - self.t0

    def seed(self, *extra: int) -> int:
        """A per-rank seed derived from the job seed (and the restart: a resumed run explores afresh)."""
        return self.seed_of(self.topo.rank, *extra)

    def seed_of(self, rank: int, *extra: int) -> int:
        """Rank ``rank``'s seed (an inference worker draws its actors' exploration from their own seeds)."""
        restart = [self.resume.restart] if self.resume else []
        return int(np.random.SeedSequence([self.cfg.run.seed, rank, *extra, *restart]).generate_state(1)[0])


class Interval:
    """True every ``seconds`` (for metric rows)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.last = time.perf_counter()

    def due(self) -> bool:
        now = time.perf_counter()
        if now - self.last >= self.seconds:
            self.last = now
            return True
        return False
