"""Under mpiexec: each rank counts its own observations (a different number of rows from a different distribution
per rank) as moments, float32 as they travel inside a gradient; the moments are merged two ways -- summed by an
allreduce and folded once (DD-PPO's path), and folded one rank at a time on rank 0 (a parameter server's path) --
and both must equal one pass over all the ranks' data. One column is near 100 with a spread of 0.1: about a shift,
float32 keeps its variance (about 0 it would lose 2 % of it). Prints "ok <ranks>" on rank 0."""

import sys

import numpy as np
from mpi4py import MPI

from mpirl.agents.running_stats import Moments, RunningStats


def data(rank: int) -> np.ndarray:
    rng = np.random.default_rng(rank)
    rows = 500 + 137 * rank
    return (rng.normal(size=(rows, 3)) * [1.0, 10.0, 0.1] + [rank, -5.0, 100.0]).astype(np.float32)


def main() -> int:
    comm = MPI.COMM_WORLD
    shift = data(0)[0]  # a reference every rank knows without a message (the job's: its first observation)
    mine = Moments((3,), shift)
    for part in np.array_split(data(comm.rank), 4):  # counted a few rows at a time, as steps come
        mine.add(part)
    sent = np.zeros(7, np.float32)
    mine.take(sent)
    total = np.zeros(7, np.float32)
    comm.Allreduce(sent, total, op=MPI.SUM)
    reduced = RunningStats((3,))
    reduced.fold(total, mine.shift)
    every = comm.gather(sent, root=0)
    if comm.rank:
        return 0
    served = RunningStats((3,))
    for m in every:
        served.fold(m, mine.shift)
    whole = np.concatenate([data(r) for r in range(comm.size)]).astype(np.float64)
    for stats in (reduced, served):
        assert stats.count == len(whole), (stats.count, len(whole))
        assert np.allclose(stats.mean, whole.mean(0), rtol=1e-5, atol=1e-5), (stats.mean, whole.mean(0))
        assert np.allclose(stats.var, whole.var(0), rtol=1e-4), (stats.var, whole.var(0))
    print("ok", comm.size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
