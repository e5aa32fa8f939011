"""Who is who in the job, and the communicators between neighbours.

Rank 0 is the learner, ranks 1..R the buffers, the rest actors. Each actor is
assigned to a buffer on its own node where one has room (node-local first),
otherwise to the buffer with the fewest actors. ``COMM_WORLD`` is split once:

* ``group``/``group_params``: a buffer and its actors (buffer is rank 0 there);
  experiences travel on ``group``, parameter broadcasts on its duplicate.
* ``learner``/``learner_params``: the learner and the buffers (learner is rank 0);
  requests, batches and priorities on the first, parameter broadcasts on the second.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mpi4py import MPI

LEARNER, BUFFER, ACTOR = "learner", "buffer", "actor"


def assign_actors(hosts: list[str], buffers: int, node_local: bool = True) -> dict[int, int]:
    """Actor world rank -> buffer world rank, deterministic from the host list alone.

    Every rank after the buffers is an actor; buffer k takes ceil or floor of
    actors/buffers of them (the first ``actors % buffers`` buffers one more),
    preferring actors on its own host.
    """
    buffer_ranks = list(range(1, 1 + buffers))
    base, extra = divmod(len(hosts) - 1 - buffers, buffers)
    room = {b: base + (i < extra) for i, b in enumerate(buffer_ranks)}
    load = {b: 0 for b in buffer_ranks}
    out = {}
    for actor in range(1 + buffers, len(hosts)):
        free = [b for b in buffer_ranks if load[b] < room[b]]
        local = [b for b in free if hosts[b] == hosts[actor]] if node_local else []
        choice = min(local or free, key=lambda b: (load[b], b))
        out[actor] = choice
        load[choice] += 1
    return out


@dataclass
class Topology:
    world: MPI.Comm
    role: str
    hosts: list[str]
    buffer_of: dict[int, int]
    group: MPI.Comm | None = None
    group_params: MPI.Comm | None = None
    learner: MPI.Comm | None = None
    learner_params: MPI.Comm | None = None
    comms: list = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def buffers(self) -> list[int]:
        return sorted(set(self.buffer_of.values()))

    def role_of(self, rank: int) -> str:
        """The role of world rank ``rank``."""
        return LEARNER if rank == 0 else ACTOR if rank in self.buffer_of else BUFFER

    def actors_of(self, buffer_rank: int) -> list[int]:
        return sorted(a for a, b in self.buffer_of.items() if b == buffer_rank)

    @property
    def n_actors(self) -> int:
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


def build(world: MPI.Comm, buffers: int, node_local: bool = True) -> Topology:
    """Split ``world`` into the job's communicators. Collective over ``world``."""
    hosts = world.allgather(MPI.Get_processor_name())
    buffer_of = assign_actors(hosts, buffers, node_local)
    rank = world.rank
    role = LEARNER if rank == 0 else BUFFER if rank <= buffers else ACTOR
    topo = Topology(world=world, role=role, hosts=hosts, buffer_of=buffer_of)

    group_color = rank if role == BUFFER else buffer_of.get(rank, MPI.UNDEFINED)
    group = world.Split(group_color, key=0 if role == BUFFER else rank)
    learner = world.Split(0 if role != ACTOR else MPI.UNDEFINED, key=rank)
    if group != MPI.COMM_NULL:
        topo.group, topo.group_params = group, group.Dup()
        topo.comms += [topo.group, topo.group_params]
    if learner != MPI.COMM_NULL:
        topo.learner, topo.learner_params = learner, learner.Dup()
        topo.comms += [topo.learner, topo.learner_params]
    return topo
