"""The learner-buffer-actor layout of the replay-based algorithms: rank 0 the learner, ranks 1..R the buffers,
then ``topology.workers`` inference workers, the rest actors (:mod:`mpirl.comm.topology`); with
``topology.workers = "learner"`` the learner's rank is the one worker. What an algorithm's ``algorithm.py``
exposes for it."""

from __future__ import annotations

import importlib

from mpirl.comm.topology import ACTOR, BUFFER, LEARNER, WORKER, build
from mpirl.config import JobConfig


def build_topology(world, cfg: JobConfig):
    t = cfg.topology
    return build(world, t.buffers, t.node_local, t.worker_ranks, on_learner=t.on_learner)


def inference(t) -> str:
    """Where the actors' policy runs, for a job's description: '' (in the actors), or the workers."""
    if t.on_learner:
        return ", inference worker on the learner's rank (AW)"
    return f", {t.workers} inference worker(s)" if t.workers else ""


def rank_files(topo) -> dict[str, str]:
    """The HDF5 files run.h5 links: the learner's, each buffer's (actors' rows live in their buffer's file) and
    each worker's (its actors' rows)."""
    workers = sorted(set(topo.worker_of.values()))
    return {"learner": "learner.h5", **{f"buffer_{b}": f"buffer_{b}.h5" for b in topo.buffers},
            **{f"worker_{w}": f"worker_{w}.h5" for w in workers}}


def rank_role(cfg: JobConfig, world_size: int, rank: int) -> str:
    """The role of ``rank`` before the topology is built (for the per-node memory check)."""
    t = cfg.topology
    return (LEARNER if rank == 0 else BUFFER if rank <= t.buffers else WORKER if rank <= t.buffers + t.worker_ranks
            else ACTOR)


def lazy_roles(package: str) -> dict:
    """Role name -> loop for an algorithm package with ``learner.run_learner``, ``buffer.run_buffer`` and a
    ``serving`` module (its games and decisions); each module is imported when its rank starts (a rank imports
    only its own loop).

    The actors run :mod:`mpirl.roles.actor` over the package's ``serving`` module; with inference workers
    (``topology.workers``) the workers run :mod:`mpirl.roles.worker` and the actors :mod:`mpirl.roles.env_actor`,
    over the same module."""
    def loop(module: str, func: str):
        def run(ctx):
            return getattr(importlib.import_module(f"{package}.{module}"), func)(ctx)
        return run

    def served(module: str, func: str):
        def run(ctx):
            serving = importlib.import_module(f"{package}.serving")
            return getattr(importlib.import_module(f"mpirl.roles.{module}"), func)(ctx, serving)
        return run

    local_actor, env_actor = served("actor", "run_actor"), served("env_actor", "run_env_actor")
    train = loop("learner", "run_learner")

    def learner(ctx):
        if ctx.cfg.topology.on_learner:  # the learner's rank is the worker: it serves with the algorithm's module
            ctx.serving = importlib.import_module(f"{package}.serving")
        return train(ctx)

    def actor(ctx):
        return (env_actor if ctx.topo.worker_of else local_actor)(ctx)
    return {LEARNER: learner, BUFFER: loop("buffer", "run_buffer"),
            WORKER: served("worker", "run_worker"), ACTOR: actor}
