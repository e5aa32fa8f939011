"""The learner-buffer-actor layout of the replay-based algorithms: rank 0 the learner, ranks 1..R the buffers,
the rest actors (:mod:`mpirl.comm.topology`); what an algorithm's ``algorithm.py`` exposes for it."""

from __future__ import annotations

import importlib

from mpirl.comm.topology import ACTOR, BUFFER, LEARNER, build
from mpirl.config import JobConfig


def build_topology(world, cfg: JobConfig):
    return build(world, cfg.topology.buffers, cfg.topology.node_local)


def rank_files(topo) -> dict[str, str]:
    """The HDF5 files run.h5 links: the learner's and each buffer's (actors' rows live in their buffer's file)."""
    return {"learner": "learner.h5", **{f"buffer_{b}": f"buffer_{b}.h5" for b in topo.buffers}}


def rank_role(cfg: JobConfig, world_size: int, rank: int) -> str:
    """The role of ``rank`` before the topology is built (for the per-node memory check)."""
    return LEARNER if rank == 0 else BUFFER if rank <= cfg.topology.buffers else ACTOR


def lazy_roles(package: str) -> dict:
    """Role name -> loop for an algorithm package with ``learner.run_learner``, ``buffer.run_buffer`` and
    ``actor.run_actor``; each module is imported when its rank starts (a rank imports only its own loop)."""
    def loop(module: str, func: str):
        def run(ctx):
            return getattr(importlib.import_module(f"{package}.{module}"), func)(ctx)
        return run
    return {LEARNER: loop("learner", "run_learner"), BUFFER: loop("buffer", "run_buffer"),
            ACTOR: loop("actor", "run_actor")}
