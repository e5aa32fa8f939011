"""The learner-buffer-actor layout of the replay-based algorithms: rank 0 the learner, ranks 1..R the buffers,
then ``topology.workers`` inference workers, the rest actors (:mod:`mpirl.comm.topology`); with
``topology.workers = "learner"`` the learner's rank is the one worker. What an algorithm's ``algorithm.py``
exposes for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpirl.job.contract import RoleLoop, lazy_loop
from mpirl.comm.topology import Layout, Link, Topology, build
from mpirl.config import JobConfig
from mpirl.replay_job import actor_count
from mpirl.job.memory import WORLD_SIZE, Estimate

if TYPE_CHECKING:
    from mpi4py import MPI

    from mpirl.actor_learner.builder import ActorLearnerBuilder
    from mpirl.job.context import RoleContext


LEARNER, BUFFER, WORKER, ACTOR = "learner", "buffer", "worker", "actor"


def build_topology(world: MPI.Comm, cfg: JobConfig) -> Topology:
    return build(world, layout(cfg, world.size), cfg.topology.node_local)


def inference(t) -> str:
    """Where the actors' policy runs, for a job's description: '' (in the actors), or the workers."""
    if t.on_learner:
        return ", inference worker on the learner's rank (AW)"
    return f", {t.workers} inference worker(s)" if t.workers else ""


def rank_files(topo: Topology) -> dict[str, str]:
    """The HDF5 files run.h5 links: the (first) learner's, each other learner's, each buffer's (actors' rows live in
    their buffer's file) and each worker's (its actors' rows)."""
    workers = sorted(set(topo.worker_of.values()))
    learners = topo.layout.ranks.get(LEARNER, (0,))
    return {"learner": "learner.h5", **{f"learner_{k}": f"learner_{k}.h5" for k in learners[1:]},
            **{f"buffer_{b}": f"buffer_{b}.h5" for b in topo.buffers},
            **{f"worker_{w}": f"worker_{w}.h5" for w in workers}}


def layout(cfg: JobConfig, world_size: int) -> Layout:
    """Rank 0 the learner (ranks 0..K-1 with K data-parallel learners), then the R buffers, then the inference
    workers, the rest actors. Senders (actors, or the workers that act for them, or the learner's rank when it is
    the one worker) send experience to their buffer and take parameters from it; every learner asks every buffer
    for samples (or dumps); the first learner publishes parameters to the buffers; K learners sum their gradients
    on a communicator of their own."""
    t = cfg.topology
    k, b, w = t.learners, t.buffers, t.worker_ranks
    ranks = {LEARNER: tuple(range(k)), BUFFER: tuple(range(k, k + b)), WORKER: tuple(range(k + b, k + b + w)),
             ACTOR: tuple(range(k + b + w, world_size))}
    server = WORKER if w else LEARNER if t.on_learner else ""
    sender = server or ACTOR
    links = [Link("experience", sender, BUFFER), Link("requests", LEARNER, BUFFER, hub="source", span="all"),
             Link("parameters", LEARNER, BUFFER, hub="source", span="first")]
    if sender != LEARNER:  # the learner's rank, when it is the one worker, has its parameters of its own
        links.insert(1, Link("parameters", BUFFER, sender, hub="source"))
    if server:
        links.append(Link("observations", ACTOR, server))
    if k > 1:
        links.append(Link("gradients", LEARNER, LEARNER))
    return Layout({role: r for role, r in ranks.items() if r}, tuple(links))


def star_estimate(cfg: JobConfig, world_size: int, learner: float, buffer: float, actor: float, worker: float,
                  slot: float, network_bytes: int, reserved: int = 0, network_key: str = "agent.hidden",
                  cache_bytes: int = 0, parts: dict | None = None) -> Estimate:
    """An :class:`~mpirl.job.memory.Estimate` of this layout from one rank of each role; ``parts``: what sizes
    each role's rank (:attr:`Estimate.parts`; a sender's count is :func:`sender_count`'s key)."""
    t = cfg.topology
    return Estimate({LEARNER: int(learner), BUFFER: int(buffer), WORKER: int(worker), ACTOR: int(actor)},
                    {LEARNER: t.learners, BUFFER: t.buffers, WORKER: t.worker_ranks,
                     ACTOR: actor_count(cfg, world_size)},
                    slot, network_bytes, reserved, network_key=network_key, cache_bytes=int(cache_bytes),
                    parts={role: {k: int(b) for k, b in p.items() if b} for role, p in (parts or {}).items()},
                    counts=counts(cfg))


def counts(cfg: JobConfig) -> dict[str, str]:
    """The setting that counts each role's ranks (the actors: the world size when ``topology.actors`` is 0)."""
    return {LEARNER: "topology.learners", BUFFER: "topology.buffers", WORKER: "topology.workers",
            ACTOR: "topology.actors" if cfg.topology.actors else WORLD_SIZE}


def sender_count(cfg: JobConfig) -> str:
    """The setting that counts the ranks sending to a buffer (its actors, or the inference workers)."""
    return counts(cfg)[WORKER if cfg.topology.worker_ranks else ACTOR]


def _span(ranks: list[int]) -> str:
    return (f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 and ranks[-1] - ranks[0] == len(ranks) - 1
            else ",".join(map(str, ranks)))


def role_map(topo: Topology) -> str:
    """``0 learner; 1 buffer, 2-3 actors of buffer 1`` (with workers: ``1 buffer, 2 worker of buffer 1;
    3-5 actors of worker 2``): who is who, for messages that name ranks."""
    on_learner = 0 in topo.worker_of.values()  # the learner is the worker (AW): ``0 learner and worker; 1 buffer``
    learners = list(topo.layout.ranks.get(LEARNER, (0,)))
    plural = "s" if len(learners) > 1 else ""
    parts = ["0 learner and worker" if on_learner else f"{_span(learners)} learner{plural}"]
    sender = "worker" if topo.worker_of else "actor"
    for b in topo.buffers:
        ranks = [r for r in topo.actors_of(b) if r != 0]
        parts.append(f"{b} buffer" + (f", {_span(ranks)} {sender}{'s' if len(ranks) > 1 else ''} of buffer {b}"
                                      if ranks else ""))
    for w in sorted(set(topo.worker_of.values())):
        ranks = topo.served_by(w)
        parts.append(f"{_span(ranks)} actor{'s' if len(ranks) > 1 else ''} of worker {w}")
    return "; ".join(parts)


def roles(builder: ActorLearnerBuilder) -> dict[str, RoleLoop]:
    """Role name -> loop for an algorithm of the family, each loop over the algorithm's ``builder``; a loop's
    module is imported when its rank starts (a rank imports only its own loop: a buffer never imports torch).

    The actors run :mod:`mpirl.actor_learner.actor`; with inference workers (``topology.workers``) the workers run
    :mod:`mpirl.actor_learner.worker` and the actors :mod:`mpirl.actor_learner.env_actor`."""
    def loop(module: str, func: str) -> RoleLoop:
        return lazy_loop(f"mpirl.actor_learner.{module}", func, builder)

    local_actor, env_actor = loop("actor", "run_actor"), loop("env_actor", "run_env_actor")

    def actor(ctx: RoleContext) -> str | None:
        return (env_actor if ctx.topo.worker_of else local_actor)(ctx)
    return {LEARNER: loop("learner", "run_learner"), BUFFER: loop("replay_buffer", "run_buffer"),
            WORKER: loop("worker", "run_worker"), ACTOR: actor}
