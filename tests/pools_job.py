"""Rank 0's :class:`mpirl.comm.pools.RecvPool` takes one message from each other rank; rank 1 sends last (after
the others' messages are in), so one ``Testsome`` completes receives that are not the first ones posted. Run by
``tests/test_pools.py``: ``mpiexec -n N python tests/pools_job.py OUT.json``; rank r sends ``10 * r`` bytes."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

from mpirl.comm.pools import RecvPool

TAG = 9


def main() -> None:
    comm = MPI.COMM_WORLD
    others = list(range(1, comm.size))
    if comm.rank == 0:
        pool = RecvPool(comm, others, TAG, 10 * comm.size, depth=1)
        got: dict[int, int] = {}
        while len(got) < len(others) - 1:  # every message but rank 1's
            got.update({src: n for _, src, _, n in pool.poll()})
        comm.Barrier()  # now rank 1 sends
        while len(got) < len(others):
            got.update({src: n for _, src, _, n in pool.poll()})
        pool.close()
        with open(sys.argv[1], "w") as f:
            json.dump({"got": got, "bytes_received": pool.bytes_received, "messages": pool.messages}, f)
    else:
        if comm.rank == 1:
            comm.Barrier()
        comm.Send([np.full(10 * comm.rank, comm.rank, np.uint8), MPI.BYTE], dest=0, tag=TAG)
        if comm.rank != 1:
            comm.Barrier()


if __name__ == "__main__":
    main()
