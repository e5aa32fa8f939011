"""How much memory each rank of a job will hold, and the check against a node.

Each algorithm estimates its own ranks (in its folder of mpirl/algos/); this module holds the constants
they share, the :class:`Estimate` and the check against a node's available memory.

The estimate is built from what the job allocates: the replay memories from the
record spec and capacity (frames stored once: about one 84x84 frame a slot), the
message buffers from their layouts, the learner's networks, optimizer state and
activations from the network itself. ``PROCESS`` is what a rank holds before any
of that (Python, numpy, torch, mpi4py, h5py; numba's compiler on ranks with a sum
tree), measured on the default CartPole job (peak RSS per rank in ``run.h5``'s
``peak_rss_bytes``: 318 MB for an actor, 360 MB for a buffer, 398 MB for the learner; of
a rank's 313 MB after its imports, 176 MB are its own and 137 MB file pages of the
libraries, which the ranks of a node share: ``LIBRARIES`` counts them once per node).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


from mpirl.config import ConfigError, JobConfig

MB = 2**20
PROCESS = 180 * MB  # a rank's private memory with its imports (torch included), before the job's own arrays
LIBRARIES = 140 * MB  # the imported libraries' file-backed pages, shared by the ranks of a node: counted once
ATARI = 45 * MB  # ale-py, on every rank of an Atari job (each checks the environment before it starts)
NUMBA = 45 * MB  # the compiled sum tree's compiler and kernels (buffers; the baseline learner)
TRAINING = 80 * MB  # torch's autograd and optimizer machinery on the learner
FRAMES_PER_SLOT = 1.25  # distinct frames a slot holds with frames stored once (one a step, plus resets)
SLOT_INDEX = 16 + 4 + 8  # sum tree leaf and its share of the inner nodes, raw priority, version


WORLD_SIZE = "world size"  # what counts a role's ranks when no setting does: every rank left (mpiexec -n)


@dataclass
class Estimate:
    """Bytes of one rank of each role (``per_rank``, by the role names of the algorithm's layout) and how many
    ranks play it (``ranks``), and what sizes them, for the message that names the setting to change.

    ``parts``: for a role, the bytes of one of its ranks that a setting sizes (``{"replay.capacity": ...}``; a
    count of another role's ranks, such as the actors whose messages a buffer holds, by that count's setting);
    ``counts``: the setting that counts a role's ranks (``topology.actors``; :data:`WORLD_SIZE` where the world
    size does). A refusal names the setting whose change shrinks the need most (:meth:`shares`)."""
    per_rank: dict[str, int]
    ranks: dict[str, int]
    slot_bytes: float = 0.0  # one replay slot (0: no replay)
    network_bytes: int = 0
    reserved: int = 0  # the largest single reservation (the frame pool's worst case), touched or not
    network_key: str = "agent.hidden"  # the setting that sizes the network, named when the network dominates
    fix_text: str = ""  # the fix to name with network_key (an algorithm without a network: its tables)
    labels: dict[str, str] = field(default_factory=dict)  # a role's name in the message ("Q-server")
    cache_bytes: int = 0  # the learner's frame cache (replay.frame_cache), when the job keeps one
    parts: dict[str, dict[str, int]] = field(default_factory=dict)
    counts: dict[str, str] = field(default_factory=dict)
    fixes: dict[str, str] = field(default_factory=dict)  # an algorithm's own words for a setting's fix

    def of(self, role: str) -> int:
        """One rank of ``role``."""
        return self.per_rank.get(role, 0)

    def largest(self) -> int:
        """The largest single rank."""
        return max(self.per_rank.values(), default=0)

    def total(self) -> int:
        """All ranks on one node."""
        return LIBRARIES + sum(b * self.ranks.get(role, 0) for role, b in self.per_rank.items())

    def world(self) -> int:
        return sum(self.ranks.values())

    def text(self) -> str:
        parts = []
        for role, b in self.per_rank.items():
            n, name = self.ranks.get(role, 0), self.labels.get(role, role)
            gib = f"{b / 2**30:.{1 if b >= 2**30 else 2}f} GiB"
            if n == 1:
                parts.append(f"{name} {gib}")
            elif n:
                parts.append(f"{n:,} {name}(s) {gib} each")
        return ", ".join(parts)

    def shares(self, largest_only: bool = False) -> dict[str, int]:
        """Bytes each setting accounts for, in the largest rank alone or on a node holding every rank: a size's
        share is what it puts in one rank times the ranks that hold it; a count's, every rank of its roles but
        one (what fewer ranks would save)."""
        roles = [r for r in self.per_rank if self.ranks.get(r, 0)]
        if largest_only:
            roles = [max(roles, key=self.per_rank.__getitem__)] if roles else []
        out: dict[str, int] = {}
        for role in roles:
            n = 1 if largest_only else self.ranks[role]
            for key, b in self.parts.get(role, {}).items():
                out[key] = out.get(key, 0) + n * int(b)
            count = self.counts.get(role)
            if count and n > 1:
                out[count] = out.get(count, 0) + (n - 1) * self.per_rank[role]
        return out

    def is_count(self, key: str) -> bool:
        """Whether ``key`` counts ranks (the world size, or a role's count such as ``topology.actors``)."""
        return key == WORLD_SIZE or key in self.counts.values()

    def at_fewest(self, key: str, largest_only: bool = False) -> int:
        """What count ``key`` would still account for with one rank of the roles it counts: the parts it sizes in
        other ranks (a server's buffer per worker) divided by that count; fewer ranks of its own roles cost none."""
        counted = sum(self.ranks.get(role, 0) for role, k in self.counts.items() if k == key) or 1
        roles = [r for r in self.per_rank if self.ranks.get(r, 0)]
        if largest_only:
            roles = [max(roles, key=self.per_rank.__getitem__)] if roles else []
        sized = sum((1 if largest_only else self.ranks[r]) * int(self.parts.get(r, {}).get(key, 0)) for r in roles)
        return sized // counted

    def fix(self, cfg: JobConfig, largest_only: bool = False, need: int | None = None,
            available: int | None = None) -> tuple[str, str]:
        """The field to name and the fix: the setting with the largest share of the need, but never a count of
        ranks that, at one rank, would still leave ``need`` above ``available`` (a rank too big alone is made
        smaller by a size, not by fewer ranks)."""
        shares = {k: b for k, b in self.shares(largest_only).items() if b > 0}
        if need is not None and available is not None:
            helps = {k: b for k, b in shares.items()
                     if not self.is_count(k) or need - (b - self.at_fewest(k, largest_only)) <= available}
            shares = helps or {k: b for k, b in shares.items() if not self.is_count(k)} or shares
        if shares:
            key = max(shares, key=shares.__getitem__)
            return key, self.fix_for(cfg, key)
        replay = self.slot_bytes * cfg.replay.capacity  # an estimate without parts: the replay or the network
        key = ("replay.frame_cache" if self.cache_bytes > max(replay, self.network_bytes)
               else "replay.capacity" if replay >= self.network_bytes else self.network_key)
        return key, self.fix_for(cfg, key)

    def fix_for(self, cfg: JobConfig, key: str) -> str:
        """What to do about ``key``, in words."""
        if key in self.fixes:
            return self.fixes[key]
        if key == "replay.frame_cache":
            return (f"lower replay.frame_cache (now {cfg.replay.frame_cache:,} frames per buffer, "
                    f"{self.cache_bytes / 2**30:,.1f} GiB on the learner; 0 turns the cache off), or run the ranks on "
                    "more nodes")
        if key == "replay.capacity":
            return (f"lower replay.capacity (now {cfg.replay.capacity:,}; about {self.slot_bytes / 1024:,.1f} KiB a "
                    "slot), or run the ranks on more nodes")
        if key == WORLD_SIZE:
            return (f"run fewer ranks (the world has {self.world():,}: mpiexec -n, srun -n), or spread them over "
                    "more nodes")
        if key in self.counts.values():
            section, name = key.split(".")
            return (f"lower {key} (now {getattr(getattr(cfg, section), name):,}: a world of {self.world():,} "
                    "ranks), or run the ranks on more nodes")
        if key == self.network_key:
            if self.fix_text:
                return self.fix_text
            section, name = key.split(".")
            return f"use a smaller network ({key}, now {getattr(getattr(cfg, section), name)}) or a bigger node"
        section, name = key.split(".")
        return f"lower {key} (now {getattr(getattr(cfg, section), name)}), or run the ranks on more nodes"


def departs_most(cfg: JobConfig, *keys: str) -> str:
    """Of settings that multiply one part of the memory together (a batch of batch_size x unroll steps), the one
    whose value departs most from its default (the algorithm's), as a ratio: the one a refusal names, since it is
    most likely the one a user raised. Ties go to the first."""
    import math

    from mpirl.config import defaults
    base = defaults(cfg.agent.algorithm)

    def departure(key: str) -> float:
        section, name = key.split(".")
        now, was = getattr(getattr(cfg, section), name), getattr(getattr(base, section), name)
        try:
            return abs(math.log(max(float(now), 1e-300) / max(float(was), 1e-300)))
        except (TypeError, ValueError):
            return 0.0
    return max(keys, key=lambda k: (departure(k), -keys.index(k)))


def available_bytes() -> int | None:
    """This node's available memory (Linux MemAvailable), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def held_bytes() -> int:
    """What this process already holds of its own (Linux RssAnon; 0 where it cannot be read): a job's ranks check
    a node after they started, and the memory they hold by then is theirs, not another job's."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def reservable_bytes() -> int | None:
    """RAM plus swap: the most one allocation may reserve under Linux's default overcommit heuristic."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
        return info["MemTotal"] + info.get("SwapTotal", 0)
    except (OSError, KeyError, ValueError, IndexError):
        return None


def check_fits(cfg: JobConfig, est: Estimate, need: int, where: str, available: int | None,
               largest_only: bool = False) -> None:
    """ConfigError naming the field and the fix when ``need`` bytes (the largest rank alone, or all of them)
    do not fit in ``available``."""
    limit = reservable_bytes()
    if limit is not None and est.reserved > limit:
        raise ConfigError("replay.capacity", f"the frame pool of {cfg.replay.capacity:,} slots reserves "
                          f"{est.reserved / 2**30:.1f} GiB (room for no frame shared) and a node has "
                          f"{limit / 2**30:.1f} GiB of RAM and swap; lower replay.capacity")
    if available is None or need <= available:
        return
    key, fix = est.fix(cfg, largest_only, need, available)
    raise ConfigError(key, f"the job needs about {need / 2**30:.1f} GiB on {where} ({est.text()}), "
                           f"{available / 2**30:.1f} GiB are available; {fix}")
