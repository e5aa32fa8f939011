"""The MPI half of ``mpirl bench gradients``: one gradient allreduce the way the gradient family's workers do it,
against mpi4py's bare blocking ``Allreduce`` of the same buffer, on every rank of the job.

Run by the benchmark as ``mpiexec -n W python -m mpirl.bench.allreduce_job allreduce OUT.json OPTS``; rank 0
writes the measurements to OUT.json. OPTS (JSON): ``sizes`` ({label: float32 elements}), ``reps``, ``seconds``.

* ours: exactly the reduction of :meth:`mpirl.gradients.exchange.Peers.update` (``a3c.exchange = "allreduce"``),
  :meth:`Peers.reduce`, which is :meth:`mpirl.comm.collectives.Collectives.sum`: the flat float32 gradient summed
  into a preallocated buffer, with MPI's blocking ``Allreduce`` when every rank has a core of its own, else an
  ``Iallreduce`` polled with a short back-off. The mean's 1/W rides in the copy into the parameters' gradients
  that either path needs (:meth:`mpirl.agents.a3c.A3cModel.apply`), so it is not timed here; nor is the optimizer
  step that follows.
* bare: ``comm.Allreduce(grad, out, op=MPI.SUM)`` in a tight loop: what this MPI does with a blocking call.

Every rank runs the same number of calls per repetition (fixed beforehand from a short probe, so the collectives
match); a repetition's time is the slowest rank's, from a barrier. Ours and bare alternate which goes first.
Before timing, ours is checked to give the bare sum.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from mpirl.bench.mpi_entry import main as entry
from mpirl.comm.collectives import Collectives


def bare(comm, grad: np.ndarray, out: np.ndarray) -> None:
    comm.Allreduce(grad, out, op=MPI.SUM)


def _timed(comm, op, calls: int) -> float:
    """Seconds for ``calls`` calls of ``op`` on every rank: the slowest rank's, from a barrier."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        op()
    return comm.allreduce(time.perf_counter() - start, op=MPI.MAX)


def measure(comm, n: int, reps: int, seconds: float) -> dict:
    """Updates/s of ours and bare on an ``n``-element float32 gradient, ``reps`` repetitions of about ``seconds``."""
    coll = Collectives(comm)  # what Peers.reduce calls: Collectives.sum into a preallocated buffer
    grad = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
    total, out = np.empty_like(grad), np.empty_like(grad)
    impls = {"ours": lambda: coll.sum(grad, total), "bare": lambda: bare(comm, grad, out)}
    for op in impls.values():  # warm-up (first-touch of buffers, the collective's set-up)
        op()
    if not np.allclose(total, out, rtol=1e-5, atol=1e-6):
        raise RuntimeError(f"rank {comm.rank}: the Iallreduce path's sum differs from the bare one")
    probe = max(_timed(comm, op, 3) / 3 for op in impls.values())
    calls = max(3, int(seconds / max(probe, 1e-9)))
    result: dict = {"calls": calls, "ours": [], "bare": []}
    for rep in range(reps):
        order = list(impls) if rep % 2 == 0 else list(impls)[::-1]
        for name in order:
            result[name].append(calls / _timed(comm, impls[name], calls))
    return result


def measure_sizes(comm, opts: dict) -> dict:
    return {label: measure(comm, int(n), int(opts.get("reps", 5)), float(opts.get("seconds", 0.3)))
            for label, n in opts["sizes"].items()}


if __name__ == "__main__":
    entry("mpirl.bench.allreduce_job", "allreduce", measure_sizes)
