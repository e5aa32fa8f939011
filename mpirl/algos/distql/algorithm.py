"""DistQL behind the algorithm seam: rank 0 the Q-server, ranks 1..N the workers.

Its layout is one link, each worker's exchange with the server: the communicator of that link has the server as
rank 0 and each worker at its world rank. The loops are the exchange family's (:mod:`mpirl.exchange`), over
:class:`~mpirl.algos.distql.builder.DistqlBuilder`. No rank imports torch: checkpoints are HDF5
(:mod:`mpirl.exchange.checkpoint`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from mpirl.agents.tabular import PAIR_BYTES
from mpirl.algos.distql.builder import DistqlBuilder
from mpirl.algos.distql.settings import MAX_TABLE
from mpirl.exchange.builder import LINK, SERVER, WORKER, roles
from mpirl.exchange.messages import exchange_nbytes, reply_nbytes, state_nbytes
from mpirl.job.contract import Checked, RoleLoop
from mpirl.comm.topology import Layout, Link, Topology, build
from mpirl.config import ConfigError, JobConfig
from mpirl.job import memory

if TYPE_CHECKING:
    from mpi4py import MPI

PROCESS = 80 * memory.MB  # a rank's memory before its tables: Python, numpy, gymnasium, mpi4py, h5py, no torch
# (peak RSS of a Taxi worker 66 MB, of the server 74 MB before numba, in run.h5's peak_rss_bytes)


class TableSpaces(NamedTuple):
    n_states: int
    n_actions: int
    discretized: bool  # a Box observation through the discretizer (distql.bins)


def world_check(cfg: JobConfig, world_size: int, job_path: str) -> int:
    """The number of workers, or a ConfigError naming the world size and the command that fits."""
    d = cfg.distql
    if d.workers and world_size != d.workers + 1:
        raise ConfigError("world size", f"the job needs 1 Q-server + {d.workers} worker(s) (distql.workers), the "
                                        f"MPI world has {world_size} rank(s); run: mpirl launch -n {d.workers + 1} "
                                        f"{job_path}  (or set distql.workers = {world_size - 1})")
    if world_size < 2:
        raise ConfigError("world size", f"the job needs 1 Q-server + at least 1 worker, the MPI world has "
                                        f"{world_size} rank(s); run: mpirl launch -n {cfg.world_size} {job_path}")
    n = world_size - 1
    if len(d.worker_delay_us) not in (1, n):
        raise ConfigError("distql.worker_delay_us", f"must hold one value (for every worker) or one per worker "
                                                    f"({n}), got {len(d.worker_delay_us)}")
    return n


def spaces_of(cfg: JobConfig) -> TableSpaces:
    from mpirl.envs.discrete import make_tabular_env
    env = make_tabular_env(cfg.env, cfg.distql.bins)
    try:
        spaces = TableSpaces(env.n_states, env.n_actions, env.discretize is not None)
    finally:
        env.close()
    pairs = spaces.n_states * spaces.n_actions
    if pairs > MAX_TABLE:
        key = "distql.bins" if spaces.discretized else "env.id"
        fix = "use fewer bins" if spaces.discretized else "choose an environment with fewer states"
        raise ConfigError(key, f"the table would have {pairs:,} state-action pairs ({spaces.n_states:,} states x "
                               f"{spaces.n_actions} actions), more than {MAX_TABLE:,}; {fix}")
    return spaces


def estimate(cfg: JobConfig, workers: int, spaces: TableSpaces) -> memory.Estimate:
    """The server: its table (Q, eta, seen, merge counts), a receive and a reply buffer per worker, a state buffer
    for checkpoints; a worker: its table (Q, eta, seen, changed, update counts), its two buffers and its state's.
    Python, numpy, gymnasium, mpi4py, h5py."""
    pairs = spaces.n_states * spaces.n_actions
    episodes = min(cfg.distql.tau, cfg.distql.episodes) + 1
    buffers = exchange_nbytes(pairs, episodes) + reply_nbytes(pairs)
    server = (PROCESS + memory.NUMBA + (8 + 8 + 1 + 8) * pairs + workers * buffers + 2 * PAIR_BYTES * pairs
              + state_nbytes(pairs))
    # a worker's table is Python lists: a float object (24 B) and a list slot (8 B) per Q and eta, a slot per seen
    # flag (the bools are shared), a set entry per changed pair
    worker = PROCESS + (2 * (24 + 8) + 8 + 8) * pairs + buffers + state_nbytes(pairs)
    key = "distql.bins" if spaces.discretized else "env.id"
    count = "distql.workers" if cfg.distql.workers else memory.WORLD_SIZE
    parts = {SERVER: {key: server - PROCESS - memory.NUMBA - workers * buffers, count: workers * buffers},
             WORKER: {key: worker - PROCESS}}
    return memory.Estimate({SERVER: int(server), WORKER: int(worker)}, {SERVER: 1, WORKER: workers},
                           network_bytes=int(25 * pairs), network_key=key,
                           fix_text=f"a smaller table ({pairs:,} pairs now) or fewer workers on a node",
                           labels={SERVER: "Q-server"}, parts=parts, counts={WORKER: count})


def check(cfg: JobConfig, world_size: int, job_path: str) -> Checked:
    n = world_check(cfg, world_size, job_path)
    spaces = spaces_of(cfg)
    return Checked(spaces, {}, 0, estimate(cfg, n, spaces))


def build_topology(world: MPI.Comm, cfg: JobConfig) -> Topology:
    return build(world, layout(cfg, world.size), node_local=False)


def layout(cfg: JobConfig, world_size: int) -> Layout:
    """Rank 0 the Q-server, the rest workers; each worker exchanges its table's changes with the server."""
    return Layout({SERVER: (0,), WORKER: tuple(range(1, world_size))}, (Link(LINK, WORKER, SERVER),))


def rank_files(topo: Topology) -> dict[str, str]:
    return {"qserver": "qserver.h5"}


def role_map(topo: Topology) -> str:
    n = topo.world.size - 1
    return f"0 Q-server; {'1' if n == 1 else f'1-{n}'} worker{'s' if n > 1 else ''}"


ROLES: dict[str, RoleLoop] = roles(DistqlBuilder())


def describe(cfg: JobConfig, world_size: int, checked: Checked) -> str:
    d, s = cfg.distql, checked.spaces
    how = f" ({'x'.join(map(str, d.bins))} bins)" if s.discretized else ""
    return (f"1 Q-server, {world_size - 1} worker(s); DistQL ({d.variant}) on {cfg.env.id}: {s.n_states:,} "
            f"states{how} x {s.n_actions} actions ({s.n_states * s.n_actions:,} pairs); {d.mode.upper()} "
            f"replies, {d.exchange} exchange every {d.tau} episode(s), {d.episodes} episodes per worker")


def summary(run_dir: Path) -> str:
    from mpirl.algos.distql.info import format_summary, summarize
    return format_summary(summarize(run_dir))
