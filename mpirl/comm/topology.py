"""Who is who in the job, and the communicators between them, made from the algorithm's declared layout.

An algorithm declares its :class:`Layout` as data (its ``layout(cfg, world_size)``, :mod:`mpirl.job.contract`): each role's world ranks and the
links between roles (``Link("experience", "actor", "buffer")``). Each link is a set of star groups: the ranks
of its hub side are the hubs, every rank of the other side joins one hub (spread evenly, node-local first,
deterministic from the host list) and ``COMM_WORLD`` is split once per link, the hub rank 0 of its group.
Two links between the same two roles group the same ranks the same way (an experience link and the parameter
broadcast back along it), each on its own communicator.

The learner-buffer-actor layout of the replay algorithms (:mod:`mpirl.actor_learner.replay_layout`) reads its groups
under the names it has always had:

* ``group``/``group_params``: a buffer and its senders (buffer is rank 0 there); experiences travel on
  ``group``, parameter broadcasts on ``group_params``.
* ``learner``/``learner_params``: the learner and the buffers (learner is rank 0); requests, batches and
  priorities on the first, parameter broadcasts on the second.
* ``serve``: an inference worker and its actors (worker is rank 0): observations up, actions down.

With K inference workers (``topology.workers``, DMCAF's actor-worker-learner) the workers are the buffers'
senders (``buffer_of`` maps each *sender* to its buffer) and each actor joins a worker. With the worker on the
learner's rank (``topology.workers = "learner"``) rank 0 is the one sender of buffer 1 and the hub of ``serve``;
its parameters are its own, so the layout declares no broadcast to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, Mapping

if TYPE_CHECKING:  # imported where communicators are built: importing mpi4py.MPI initializes MPI
    from mpi4py import MPI


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


LinkKind = Literal["experience", "requests", "parameters", "gradients", "observations", "exchange"]


@dataclass(frozen=True)
class Link:
    """``source`` ranks send ``kind`` to ``target`` ranks. ``hub``: which side is rank 0 of each group (the
    side a rank of the other side joins): the target for flows into a centre (experience into a buffer,
    observations into a worker, gradients into a server), the source for broadcasts and requests. A link of a role
    with itself (``Link("gradients", "worker", "worker")``: peers averaging gradients) is one group of all the role's
    ranks, the first its rank 0. ``each``
    (parameters): sent to each member on its own rather than broadcast, for members that run at their own pace
    (:class:`~mpirl.comm.params.ParamSends`). ``span``: how the hub side's ranks divide the members: ``"star"``
    (each member joins one hub), ``"all"`` (one group of every hub and every member, the hubs first: each of K
    data-parallel learners talks to every buffer) or ``"first"`` (one group of the first hub and every member: the
    first learner's parameter broadcasts)."""
    kind: LinkKind
    source: str
    target: str
    hub: Literal["source", "target"] = "target"
    each: bool = False
    span: Literal["star", "all", "first"] = "star"

    @property
    def hubs(self) -> str:
        return self.target if self.hub == "target" else self.source

    @property
    def members(self) -> str:
        return self.source if self.hub == "target" else self.target


@dataclass(frozen=True)
class Layout:
    """The job's shape as data: each role's world ranks (in order; every rank has exactly one role) and the links
    between roles."""
    ranks: Mapping[str, tuple[int, ...]]
    links: tuple[Link, ...]

    def __post_init__(self) -> None:
        seen = sorted(r for ranks in self.ranks.values() for r in ranks)
        if seen != list(range(len(seen))):
            raise ValueError(f"a layout's ranks are 0..N-1, each in one role; got {dict(self.ranks)}")
        unknown = {name for link in self.links for name in (link.source, link.target)} - set(self.ranks)
        if unknown:
            raise ValueError(f"links name roles the layout does not have: {sorted(unknown)}")

    @property
    def size(self) -> int:
        return sum(len(r) for r in self.ranks.values())

    def role_of(self, rank: int) -> str:
        for role, ranks in self.ranks.items():
            if rank in ranks:
                return role
        raise ValueError(f"rank {rank} is outside the layout's {self.size} ranks")

    def count(self, role: str) -> int:
        return len(self.ranks.get(role, ()))

    def link(self, kind: LinkKind, source: str | None = None) -> Link | None:
        """The first link of ``kind`` (from ``source``), None when the layout has none."""
        return next((k for k in self.links if k.kind == kind and source in (None, k.source)), None)


def plan(layout: Layout, hosts: list[str], node_local: bool = True) -> dict[Link, dict[int, int]]:
    """Each link's groups: member world rank -> its hub's world rank (no MPI; the same from every rank)."""
    out = {}
    for link in layout.links:
        if link.source == link.target:  # a role with itself (gradients averaged among peers): one group, the first
            ranks = list(layout.ranks.get(link.source, ()))  # rank its hub
            out[link] = {r: ranks[0] for r in ranks}
            continue
        hubs, members = list(layout.ranks.get(link.hubs, ())), list(layout.ranks.get(link.members, ()))
        if link.span != "star" and hubs and members:  # one group, its rank 0 the first hub
            out[link] = {r: hubs[0] for r in (hubs if link.span == "all" else hubs[:1]) + members}
            continue
        out[link] = spread(hosts, hubs, members, node_local) if hubs and members else {}
    return out


@dataclass
class Topology:
    world: Any  # MPI.Comm (None in tests of the plan alone)
    role: str
    hosts: list[str]
    layout: Layout
    groups: dict[Link, dict[int, int]]  # per link: member rank -> hub rank
    comms: dict[Link, Any] = field(default_factory=dict)  # per link this rank takes part in: its group's comm

    @property
    def rank(self) -> int:
        return self.world.rank

    def role_of(self, rank: int) -> str:
        return self.layout.role_of(rank)

    def comm(self, kind: LinkKind, source: str | None = None) -> Any:
        """This rank's communicator of the link of ``kind`` (from ``source``), None when it takes no part."""
        link = self.layout.link(kind, source)
        return self.comms.get(link) if link else None

    def _group(self, kind: LinkKind) -> dict[int, int]:
        link = self.layout.link(kind)
        return self.groups.get(link, {}) if link else {}

    # The learner-buffer-actor layout's names (mpirl.actor_learner.replay_layout; shared by the replay algorithms).

    @cached_property
    def buffer_of(self) -> dict[int, int]:
        """Sender (an actor, or a worker when there are workers) -> its buffer: the experience link's groups."""
        return self._group("experience")

    @cached_property
    def worker_of(self) -> dict[int, int]:
        """Actor -> its inference worker (empty without workers): the observation link's groups."""
        return self._group("observations")

    @property
    def group(self) -> Any:
        return self.comm("experience")

    def _params_from(self, kind: LinkKind, side: str) -> Link | None:
        """The parameter link from the ``side`` ("source"/"target") role of the first ``kind`` link."""
        link = self.layout.link(kind)
        return self.layout.link("parameters", getattr(link, side)) if link else None

    @property
    def group_params(self) -> Any:
        """The buffer's parameters to its senders (None where the layout declares none)."""
        link = self._params_from("experience", "target")
        return self.comms.get(link) if link else None

    @property
    def group_params_each(self) -> bool:
        """Are they sent to each sender on its own (the link's ``each``) rather than broadcast?"""
        link = self._params_from("experience", "target")
        return bool(link and link.each)

    @property
    def learner(self) -> Any:
        return self.comm("requests")

    def _learner_params(self) -> Link | None:
        """The learner's parameters: to the buffers it sends requests to, or, in a layout without requests (the
        senders' experience straight into the learner), to those senders."""
        if self.layout.link("requests"):
            return self._params_from("requests", "source")
        return self._params_from("experience", "target")

    @property
    def learner_params(self) -> Any:
        link = self._learner_params()
        return self.comms.get(link) if link else None

    @property
    def learner_params_each(self) -> bool:
        link = self._learner_params()
        return bool(link and link.each)

    @property
    def serve(self) -> Any:
        return self.comm("observations")

    @cached_property
    def buffers(self) -> list[int]:
        return sorted(set(self.buffer_of.values()))

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
        for comm in self.comms.values():
            comm.Free()
        self.comms.clear()


def build(world: MPI.Comm, layout: Layout, node_local: bool = True) -> Topology:
    """Split ``world`` into one communicator per link of ``layout`` (collective over ``world``): a hub and the
    members that joined it, the hub rank 0, the members in world-rank order."""
    from mpi4py import MPI
    if layout.size != world.size:
        raise ValueError(f"the layout has {layout.size} ranks and the world {world.size}")
    hosts = world.allgather(MPI.Get_processor_name())
    groups = plan(layout, hosts, node_local)
    rank = world.rank
    topo = Topology(world=world, role=layout.role_of(rank), hosts=hosts, layout=layout, groups=groups)
    for link in layout.links:  # every rank splits for every link, in the layout's order
        members = groups[link]
        hub = rank in set(members.values())
        color = rank if hub else members.get(rank, MPI.UNDEFINED)
        # The hub first, then the members in world-rank order (under span "all" the other hubs, then the rest).
        comm = world.Split(color, key=0 if hub else rank + 1)
        if comm != MPI.COMM_NULL:
            topo.comms[link] = comm
    return topo
