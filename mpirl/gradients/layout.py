"""The gradient family's ranks: with a parameter server (``exchange`` = ``"async"`` or ``"sync"``) rank 0 the
server, ranks 1..W the workers, one link (the workers' gradients into the server, its replies back on the same
communicator: the server is rank 0 there, each worker at its world rank); without (``"allreduce"``) every rank a
worker, one link of the workers with themselves (their allreduce communicator). What an algorithm's
``algorithm.py`` exposes for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpirl.comm.topology import Layout, Link, Topology
from mpirl.job.contract import RoleLoop, lazy_loop

if TYPE_CHECKING:
    from mpirl.gradients.builder import GradientBuilder

SERVER, WORKER = "server", "worker"


def layout(server: bool, world_size: int) -> Layout:
    """``server``: rank 0 the parameter server and the rest workers; else every rank a worker."""
    if server:
        return Layout({SERVER: (0,), WORKER: tuple(range(1, world_size))}, (Link("gradients", WORKER, SERVER),))
    return Layout({WORKER: tuple(range(world_size))}, (Link("gradients", WORKER, WORKER),))


def rank_files(topo: Topology) -> dict[str, str]:
    """The HDF5 files run.h5 links: the updates' (the server's, or rank 0's) and each worker's."""
    workers = topo.layout.ranks[WORKER]
    return {"updates": "updates.h5", **{f"worker_{r}": f"worker_{r}.h5" for r in workers}}


def _span(ranks) -> str:
    ranks = list(ranks)
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"


def role_map(topo: Topology) -> str:
    """``0 parameter server; 1-4 workers``: who is who, for messages that name ranks."""
    workers = topo.layout.ranks[WORKER]
    if SERVER in topo.layout.ranks:
        return f"0 parameter server; {_span(workers)} worker{'s' if len(workers) > 1 else ''}"
    return f"{_span(workers)} worker{'s' if len(workers) > 1 else ''} (allreduce; 0 writes the updates)"


def roles(builder: GradientBuilder) -> dict[str, RoleLoop]:
    """Role name -> loop for an algorithm of the family, each loop over the algorithm's ``builder``; a loop's
    module is imported when its rank starts (a rank imports only its own loop)."""
    return {SERVER: lazy_loop("mpirl.gradients.server", "run_server", builder),
            WORKER: lazy_loop("mpirl.gradients.worker", "run_worker", builder)}
