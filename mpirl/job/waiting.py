"""Compute threads that wait without spinning where a node has more ranks than cores.

A learner with ``agent.torch_threads`` > 1 runs torch's OpenMP pool (GNU libgomp). Between two parallel regions its
threads spin for a while before they sleep, as OpenMP does by default: on a core of their own that saves a wake-up,
but on a node whose ranks outnumber its cores (the common case here: a laptop, a CI machine, an over-committed
allocation) the spinning takes the cores the actors, buffers and other jobs' ranks would run on. Measured here: the
suite's QMIX learning job (a learner of 2 threads, 5 ranks on 2 cores) with two busy processes beside it took 63 s and
54 CPU-s with the default, 38 s and 24 CPU-s with ``OMP_WAIT_POLICY=PASSIVE``; alone, 16 s and 23 CPU-s.

:func:`passive_when_oversubscribed` runs on every rank right after ``MPI_Init``, before torch is imported (the policy
is read when the OpenMP runtime starts): the node's ranks (``COMM_TYPE_SHARED``) count the cores their affinity masks
cover together (so ranks bound one to a core, or a cgroup's share of the node, count as they are), and where they
are more, ``OMP_WAIT_POLICY`` becomes ``PASSIVE``. A policy the user set stands.
"""

from __future__ import annotations

import os
import sys

POLICY = "OMP_WAIT_POLICY"


def node_cores() -> set[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def passive_when_oversubscribed(world) -> bool:
    """Collective on ``world`` (every rank, before torch is imported): True when this node's ranks outnumber the cores
    they may run on, and ``OMP_WAIT_POLICY`` was set to ``PASSIVE`` for this process (it was not set before)."""
    from mpi4py import MPI
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        cores = set().union(*node.allgather(sorted(node_cores())))
        ranks = node.size
    finally:
        node.Free()
    if ranks <= len(cores) or POLICY in os.environ or "torch" in sys.modules:
        return False
    os.environ[POLICY] = "PASSIVE"
    return True
