"""Who is who in the job, and the communicators between neighbours.

Rank 0 is the learner, ranks 1..R the buffers, the rest actors. Each actor is
assigned to a buffer on its own node where one has room (node-local first),
otherwise to the buffer with the fewest actors. ``COMM_WORLD`` is split once:

* ``group``/``group_params``: a buffer and its actors (buffer is rank 0 there);
  experiences travel on ``group``, parameter broadcasts on its duplicate.
* ``learner``/``learner_params``: the learner and the buffers (learner is rank 0);
  requests, batches and priorities on the first, parameter broadcasts on the second.

With K inference workers (``topology.workers``, DMCAF's actor-worker-learner), ranks
R+1..R+K are workers and the rest actors. The workers take the actors' place in the
buffer groups (they send experience and receive parameters: ``buffer_of`` maps each
*sender* to its buffer), and each actor is assigned to a worker, node-local first, the
same way. One more communicator:

* ``serve``: a worker and its actors (worker is rank 0): observations up, actions down.

With the worker on the learner's rank (``topology.workers = "learner"``, DMCAF's actor-worker)
and one buffer, rank 0 serves every actor: it is the one sender of buffer 1's ``group`` (but
not a member of ``group_params``: its parameters are its own) and rank 0 of ``serve``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mpi4py import MPI

LEARNER, BUFFER, WORKER, ACTOR = "learner", "buffer", "worker", "actor"


def spread(hosts: list[str], servers: list[int], clients: list[int], node_local: bool = True) -> dict[int, int]:
    """Client world rank -> server world rank, deterministic from the host list alone.

    Server k takes ceil or floor of clients/servers of them (the first ``clients % servers`` one
    more), preferring clients on its own host.
    """
    base, extra = divmod(len(clients), len(servers))
    room = {s: base + (i < extra) for i, s in enumerate(servers)}
    load = {s: 0 for s in servers}
    out = {}
    for client in clients:
        free = [s for s in servers if load[s] < room[s]]
        local = [s for s in free if hosts[s] == hosts[client]] if node_local else []
        choice = min(local or free, key=lambda s: (load[s], s))
        out[client] = choice
        load[choice] += 1
    return out


def assign_actors(hosts: list[str], buffers: int, node_local: bool = True) -> dict[int, int]:
    """Actor world rank -> buffer world rank: every rank after the buffers is an actor."""
    return spread(hosts, list(range(1, 1 + buffers)), list(range(1 + buffers, len(hosts))), node_local)


def assign_workers(hosts: list[str], buffers: int, workers: int,
                   node_local: bool = True) -> tuple[dict[int, int], dict[int, int]]:
    """With ``workers`` inference workers after the buffers: (worker -> buffer, actor -> worker)."""
    worker_ranks = list(range(1 + buffers, 1 + buffers + workers))
    if not worker_ranks:  # the worker on the learner's rank: it serves everyone and sends to the one buffer
        return {0: 1}, {a: 0 for a in range(1 + buffers, len(hosts))}
    buffer_of = spread(hosts, list(range(1, 1 + buffers)), worker_ranks, node_local)
    worker_of = spread(hosts, worker_ranks, list(range(1 + buffers + workers, len(hosts))), node_local)
    return buffer_of, worker_of


@dataclass
class Topology:
    world: MPI.Comm
    role: str
    hosts: list[str]
    buffer_of: dict[int, int]  # sender (an actor, or a worker when there are workers) -> its buffer
    worker_of: dict[int, int] = field(default_factory=dict)  # actor -> its worker (empty without workers)
    group: MPI.Comm | None = None
    group_params: MPI.Comm | None = None
    learner: MPI.Comm | None = None
    learner_params: MPI.Comm | None = None
    serve: MPI.Comm | None = None
    comms: list = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # the algorithm's names of the roles ("buffer": "worker")

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def buffers(self) -> list[int]:
        return sorted(set(self.buffer_of.values()))

    def role_of(self, rank: int) -> str:
        """The role of world rank ``rank``, by the algorithm's name for it."""
        role = self.layout_role(rank)
        return self.names.get(role, role)

    def layout_role(self, rank: int) -> str:
        """The place of world rank ``rank`` in the layout: learner (the hub of hubs), buffer, worker, actor."""
        if rank == 0:
            return LEARNER  # also the worker when the learner serves the actors
        if rank in self.worker_of:
            return ACTOR
        if rank in self.buffer_of:
            return WORKER if self.worker_of else ACTOR
        return BUFFER

    def actors_of(self, buffer_rank: int) -> list[int]:
        """The ranks that send experience to ``buffer_rank``: its actors, or its workers when there are workers."""
        return sorted(a for a, b in self.buffer_of.items() if b == buffer_rank)

    def served_by(self, worker_rank: int) -> list[int]:
        """The actors of a worker."""
        return sorted(a for a, w in self.worker_of.items() if w == worker_rank)

    @property
    def n_actors(self) -> int:
        """The ranks that send experience (actors, or workers when there are workers)."""
        return len(self.buffer_of)

    @property
    def least_exploring_actor(self) -> int:
        """The last actor rank: the highest Ape-X index, so the smallest epsilons."""
        return max(self.buffer_of)

    @property
    def actor_index(self) -> int:
        """This actor's index among all actors (for its exploration epsilon)."""
        return sorted(self.buffer_of).index(self.rank)

    def free(self) -> None:
        for comm in self.comms:
            comm.Free()
        self.comms.clear()


def build(world: MPI.Comm, buffers: int, node_local: bool = True, workers: int = 0,
          on_learner: bool = False, names: dict[str, str] | None = None) -> Topology:
    """Split ``world`` into the job's communicators. Collective over ``world``.

    ``on_learner``: the learner's rank is the one worker (``workers`` is then 0, ``buffers`` 1).
    ``names``: the algorithm's names of the roles (DistQL builds N buffers and no actors, and calls rank 0 the
    ``server`` and the buffers ``worker``s: its exchange runs on ``learner``)."""
    hosts = world.allgather(MPI.Get_processor_name())
    assert not on_learner or (workers == 0 and buffers == 1)
    if workers or on_learner:
        buffer_of, worker_of = assign_workers(hosts, buffers, workers, node_local)
    else:
        buffer_of, worker_of = assign_actors(hosts, buffers, node_local), {}
    rank = world.rank
    topo = Topology(world=world, role="", hosts=hosts, buffer_of=buffer_of, worker_of=worker_of,
                    names=dict(names or {}))
    role = topo.layout_role(rank)
    topo.role = topo.role_of(rank)

    serving = rank in set(worker_of.values())
    group_color = rank if role == BUFFER else buffer_of.get(rank, MPI.UNDEFINED)
    group = world.Split(group_color, key=0 if role == BUFFER else rank + 1)  # the buffer is rank 0
    learner = world.Split(0 if role in (LEARNER, BUFFER) else MPI.UNDEFINED, key=rank)
    serve = world.Split(rank if serving else worker_of.get(rank, MPI.UNDEFINED), key=0 if serving else rank + 1)
    if serve != MPI.COMM_NULL:
        topo.serve = serve
        topo.comms.append(serve)
    if group != MPI.COMM_NULL:
        # The broadcast reaches the group's senders, never the learner (it sends experience with the worker on it).
        params = group.Split(MPI.UNDEFINED if role == LEARNER else 0, key=group.rank)
        topo.group = group
        topo.comms.append(group)
        if params != MPI.COMM_NULL:
            topo.group_params = params
            topo.comms.append(params)
    if learner != MPI.COMM_NULL:
        topo.learner, topo.learner_params = learner, learner.Dup()
        topo.comms += [topo.learner, topo.learner_params]
    return topo
