"""A3C (and DPPO, DD-PPO) behind the algorithm seam: its checks, layout, roles, rank files and validate line.

The ranks are the gradient family's (:mod:`mpirl.gradients.layout`): with ``a3c.exchange`` = ``"async"`` or
``"sync"`` rank 0 the parameter server and the rest workers; with ``"allreduce"`` every rank a worker. The loops are
the family's, over :class:`~mpirl.algos.a3c.builder.A3cBuilder`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mpirl.algos.a3c.builder import A3cBuilder
from mpirl.algos.a3c.settings import has_server, updates_per_rollout
from mpirl.comm.topology import Layout, Topology, build
from mpirl.config import ConfigError, JobConfig
from mpirl.gradients import layout as family
from mpirl.gradients.layout import SERVER, WORKER, rank_files, role_map, roles  # noqa: F401 - the seam's
from mpirl.gradients.messages import max_episodes, message_nbytes, reply_nbytes
from mpirl.job.contract import Checked, RoleLoop
from mpirl.job import memory
from mpirl.agents.policy_checks import Spaces, actor_critic_params, actor_critic_spaces, normalization_values

if TYPE_CHECKING:
    from mpi4py import MPI

TEAMS = 'set agent.algorithm = "qmix" (it plays teams)'


def workers_of(cfg: JobConfig, world_size: int, job_path: str) -> int:
    """The number of workers, or a ConfigError naming the world size and the command that fits."""
    a, server = cfg.a3c, int(has_server(cfg))
    what = "1 parameter server + " if server else ""
    if a.workers and world_size != a.workers + server:
        raise ConfigError("world size", f"the job needs {what}{a.workers} worker(s) (a3c.workers), the MPI world has "
                                        f"{world_size} rank(s); run: mpirl launch -n {a.workers + server} {job_path}  "
                                        f"(or set a3c.workers = {world_size - server})")
    if world_size - server < 1:
        raise ConfigError("world size", f"the job needs {what}at least 1 worker, the MPI world has {world_size} "
                                        f"rank(s); run: mpirl launch -n {cfg.world_size} {job_path}")
    return world_size - server


def estimate(cfg: JobConfig, workers: int, spaces: Spaces, n_params: int) -> memory.Estimate:
    """A worker: its network (parameters, gradients, a received copy; Adam's two moments under allreduce), its
    rollout and the loss's activations over it, its message buffers; the server: the network, Adam's moments and a
    message and a reply buffer per worker."""
    import numpy as np
    a, E = cfg.a3c, cfg.env.envs_per_actor
    params = 4 * n_params
    # the rollout keeps what the policy acted on: float32 where the job normalises observations (images too)
    obs = int(np.prod(spaces.obs_shape)) * (4 if cfg.agent.normalize_obs else np.dtype(spaces.obs_dtype).itemsize)
    rollout = a.unroll * E * (obs + 40)
    activations = a.unroll * E * 4 * (int(np.prod(spaces.obs_shape)) + 4 * max(cfg.agent.hidden))
    episodes = max_episodes(cfg, a)
    message = message_nbytes(n_params, episodes)
    worker = (memory.PROCESS + memory.TRAINING + 4 * params + rollout + activations + message
              + reply_nbytes(n_params) + (2 * params if not has_server(cfg) else 0))
    server = memory.PROCESS + memory.TRAINING + 5 * params + workers * (message + reply_nbytes(n_params))
    per_rank, ranks = {WORKER: int(worker)}, {WORKER: workers}
    count = "a3c.workers" if a.workers else memory.WORLD_SIZE
    rollout_key = "a3c.unroll" if a.unroll >= E else "env.envs_per_actor"
    parts = {WORKER: {rollout_key: rollout + activations + 16 * episodes, "agent.hidden": 6 * params}}
    if has_server(cfg):
        per_rank[SERVER], ranks[SERVER] = int(server), 1
        parts[SERVER] = {"agent.hidden": 5 * params, count: workers * (message + reply_nbytes(n_params))}
    fix = (f"lower a3c.unroll (now {a.unroll:,}) or env.envs_per_actor (now {E:,}): each worker holds a rollout of "
           f"unroll x envs steps ({a.unroll * E:,}) and the loss's activations over it, "
           f"{(rollout + activations) / 2**30:,.1f} GiB a worker")
    return memory.Estimate(per_rank, ranks, network_bytes=params, labels={SERVER: "parameter server"},
                           parts=parts, counts={WORKER: count}, fixes={"a3c.unroll": fix, "env.envs_per_actor": fix})


def check(cfg: JobConfig, world_size: int, job_path: str) -> Checked:
    W = workers_of(cfg, world_size, job_path)
    a = cfg.a3c
    if a.exchange == "sync" and a.stragglers >= W:
        raise ConfigError("a3c.stragglers", f"must be less than the workers ({W}): each round waits for workers - "
                                            f"stragglers of them, got {a.stragglers}")
    if len(a.worker_delay_us) not in (1, W):
        raise ConfigError("a3c.worker_delay_us", f"must hold one value for every worker or one per worker ({W}), "
                                                 f"got {len(a.worker_delay_us)}: {a.worker_delay_us}")
    spaces = actor_critic_spaces(cfg, "the gradient family (agent.algorithm = \"a3c\")", TEAMS)
    n_params = actor_critic_params(spaces, cfg) + normalization_values(spaces, cfg)  # the statistics travel too
    return Checked(spaces, {}, n_params, estimate(cfg, W, spaces, n_params))


def layout(cfg: JobConfig, world_size: int) -> Layout:
    return family.layout(has_server(cfg), world_size)


def build_topology(world: MPI.Comm, cfg: JobConfig) -> Topology:
    return build(world, layout(cfg, world.size), node_local=False)


ROLES: dict[str, RoleLoop] = roles(A3cBuilder())


def describe(cfg: JobConfig, world_size: int, checked: Checked) -> str:
    a, s = cfg.a3c, checked.spaces
    W = world_size - int(has_server(cfg))
    how = {"async": f"asynchronous parameter server (max staleness {a.max_staleness})",
           "sync": f"synchronous rounds of {W - a.stragglers} of {W} (stragglers {a.stragglers})",
           "allreduce": f"allreduce, straggler preemption at {a.sync_frac:g}" + (" (off)" if a.sync_frac >= 1
                                                                                  else "")}[a.exchange]
    loss = (f"PPO ({a.epochs} epochs x {a.minibatches} minibatches)" if a.loss == "ppo" else "A2C")
    return (f"{'1 server, ' if has_server(cfg) else ''}{W} worker(s); {loss} gradients, {how}, on {cfg.env.id}: obs "
            f"{s.obs_shape} {s.obs_dtype}, {s.action.describe()}; rollouts of {a.unroll} steps x "
            f"{cfg.env.envs_per_actor} games, {updates_per_rollout(cfg)} gradient(s) each; {checked.n_params:,} "
            f"parameters ({4 * checked.n_params / 1e6:.2f} MB a gradient)")


def summary(run_dir: Path) -> str:
    from mpirl.algos.a3c.info import format_summary, summarize
    return format_summary(summarize(run_dir))
