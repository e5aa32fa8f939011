""":class:`mpirl.comm.counter.SharedCounter` under mpiexec. Run by ``tests/test_counter.py``:
``mpiexec -n N python tests/counter_job.py MODE OUT.json DIR``.

``sum``: every rank adds 1 ``ADDS`` times; each then reads ``ADDS * N``, and the values before its adds, over all
ranks, are each of ``0 .. ADDS * N - 1`` once.

``progress``: rank 0 (the counter's root) spins in pure-Python arithmetic and calls no MPI until every other rank
has left a file ``done.<rank>`` in DIR (or ``CAP`` seconds pass). The others wait for its ``busy`` file (no MPI
either), then add ``ADDS`` each and read until they see every one of them, and only then write their file. A
counter that needs the root's progress stalls them until the root gives up: the root then ends by ``cap``, and
their ``done`` times come after its end. Times are ``time.monotonic()``, one clock for every process of a node.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from mpi4py import MPI

from mpirl.comm.backoff import Backoff
from mpirl.comm.counter import SharedCounter

ADDS, CAP = 100, 30.0


def sum_main(comm: MPI.Comm, counter: SharedCounter) -> dict:
    before = [counter.add() for _ in range(ADDS)]
    comm.Barrier()  # every add flushed
    return {"before": before, "read": counter.read()}


def progress_root(comm: MPI.Comm, counter: SharedCounter, folder: str) -> dict:
    flags = [os.path.join(folder, f"done.{r}") for r in range(1, comm.size)]
    start = time.monotonic()
    with open(os.path.join(folder, "busy"), "w") as f:
        f.write(str(start))
    # Pure Python from here to `end`: no MPI call, so nothing in MPI progresses on this rank.
    x, spins, ended_by = 0, 0, "cap"
    while True:
        for i in range(20_000):
            x = (x * 31 + i) % 1_000_003
        spins += 1
        if all(os.path.exists(p) for p in flags):
            ended_by = "flags"
            break
        if time.monotonic() - start > CAP:
            break
    end = time.monotonic()
    return {"start": start, "end": end, "ended_by": ended_by, "spins": spins, "read": counter.read()}


def progress_worker(comm: MPI.Comm, counter: SharedCounter, folder: str) -> dict:
    busy = os.path.join(folder, "busy")
    while not os.path.exists(busy):
        time.sleep(1e-3)
    seen_busy = time.monotonic()
    before = [counter.add() for _ in range(ADDS)]
    added = time.monotonic()
    want, backoff, reads = ADDS * (comm.size - 1), Backoff(), 0
    while (value := counter.read()) < want:  # as a worker waits for sync_frac of the others
        reads += 1
        backoff.sleep()
    done = time.monotonic()
    with open(os.path.join(folder, f"done.{comm.rank}"), "w") as f:
        f.write(str(done))
    return {"seen_busy": seen_busy, "added": added, "done": done, "read": value, "reads": reads, "before": before}


def main() -> None:
    mode, out, folder = sys.argv[1], sys.argv[2], sys.argv[3]
    comm = MPI.COMM_WORLD
    try:
        counter = SharedCounter(comm, root=0)
        if mode == "sum":
            mine = sum_main(comm, counter)
        elif comm.rank == 0:
            mine = progress_root(comm, counter, folder)
        else:
            mine = progress_worker(comm, counter, folder)
        everything = comm.gather(mine, root=0)
        counter.free()
    except BaseException:  # the others would wait for this rank forever
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
    if everything is not None:  # rank 0
        with open(out, "w") as f:
            json.dump(everything, f)


if __name__ == "__main__":
    main()
