"""IMPALA behind the algorithm seam: its checks, roles, rank files and validate line.

The ranks are the replay algorithms' (0 the learner, then the buffers, then the actors; :mod:`mpirl.comm.topology`)
and so are the paths: actors send trajectories to their buffer, which queues them; the learner asks every queue
for its share of a batch; parameters come down in versioned broadcasts. Records: one trajectory per row
(:func:`mpirl.agents.actor_critic.trajectory_spec`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mpirl.algos.impala.builder import ImpalaBuilder
from mpirl.algos.impala.flow import queue_slots
from mpirl.comm.messages import experience_layout, request_layout, sample_layout
from mpirl.job.contract import Checked, RoleLoop
from mpirl.config import ConfigError, JobConfig
from mpirl.replay_job import actor_count, check_world_size
from mpirl.job import memory
from mpirl.agents.policy_checks import actor_critic_params, actor_critic_spaces, normalization_values
from mpirl.comm.topology import Layout, Link, Topology, build
from mpirl.actor_learner import replay_layout
from mpirl.actor_learner.replay_layout import (ACTOR, BUFFER, LEARNER, WORKER, inference, roles,
                                              sender_count, star_estimate)


if TYPE_CHECKING:
    from mpi4py import MPI

TEAMS = 'set agent.algorithm = "qmix" (it plays teams)'


def estimate(cfg: JobConfig, world_size: int, spec: dict, n_params: int) -> memory.Estimate:
    """Each rank's memory: a queue's slots and its replay's, the messages from their layouts, the network and the
    learner's batch (its activations over B trajectories x (T+1) steps)."""
    rp, c, t = cfg.replay, cfg.comm, cfg.topology
    n_act = actor_count(cfg, world_size)
    senders = t.worker_ranks or (1 if t.on_learner else n_act)
    queues = max(t.buffers, 1)  # buffers = 0: the learner's own
    group = -(-senders // queues)
    slot = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in spec.values()) + 8
    share = -(-rp.batch_size // queues)
    E = cfg.env.envs_per_actor
    message = experience_layout(spec, E).max_nbytes
    replies = (c.prefetch + 1) * sample_layout(spec, share).max_nbytes
    params = 4 * n_params
    steps = rp.batch_size * (cfg.impala.unroll + 1)
    activations = steps * 4 * (int(np.prod(spec["obs"][0][1:])) + 4 * max(cfg.agent.hidden))
    learner = (memory.PROCESS + memory.TRAINING + 4 * params + 2 * rp.batch_size * slot + activations
               + t.buffers * (replies + request_layout(share).max_nbytes))
    served = -(-n_act // senders)
    message = experience_layout(spec, E * served).max_nbytes  # a sender's message: a trajectory per game it steps
    queue = queue_slots(cfg, queues, group, E * served)  # sized by its senders, their games and the window
    held = queue + cfg.impala.replay_capacity  # the queue and its replay
    buffer = memory.PROCESS + slot * held + group * c.recv_depth * message + replies
    by_senders = slot * queue + group * c.recv_depth * message
    if cfg.impala.exchange == "async":  # parameters sent to each sender on its own: a copy per send in flight
        buffer += group * params
        by_senders += group * params
    queue_parts = {sender_count(cfg): by_senders, "impala.replay_capacity": slot * cfg.impala.replay_capacity}
    batch_key = memory.departs_most(cfg, "impala.unroll", "replay.batch_size")  # the batch: their product
    learner_parts = {"agent.hidden": 4 * params, batch_key: activations + 2 * rp.batch_size * slot}
    if not t.buffers:  # the queue is the learner's, in its process
        learner, buffer = learner + buffer - memory.PROCESS, 0
        learner_parts.update(queue_parts)
    if t.served:
        import math
        from mpirl.comm.messages import step_layout
        from mpirl.envs.games import step_spec
        served = math.ceil(n_act / max(t.worker_ranks, 1))
        step = step_layout(step_spec(_Obs(spec["obs"][0][1:], spec["obs"][1])), E).max_nbytes
        # A worker: the network, its send ring, its actors' trajectories being recorded and staged, their messages.
        worker = memory.PROCESS + c.send_ring * message + 3 * params + 2 * served * E * slot + 3 * served * step
        actor = memory.PROCESS + 3 * step  # its games and its step messages
    else:
        worker = 0
        actor = memory.PROCESS + 3 * E * slot + c.send_ring * message + 3 * params
    if t.on_learner:  # the learner's rank is the worker
        learner, worker = learner + worker - memory.PROCESS, 0
    parts = {LEARNER: learner_parts, BUFFER: queue_parts if t.buffers else {}, ACTOR: {"agent.hidden": 3 * params}}
    if t.served:
        parts[WORKER] = {"agent.hidden": 3 * params}
    batch = (f"the learner's batch holds replay.batch_size x (impala.unroll + 1) steps ({rp.batch_size:,} x "
             f"{cfg.impala.unroll + 1:,}) and their activations, or run the ranks on more nodes")
    fixes = {"impala.unroll": f"lower impala.unroll (now {cfg.impala.unroll:,}) or replay.batch_size: {batch}",
             "replay.batch_size": f"lower replay.batch_size (now {rp.batch_size:,}) or impala.unroll: {batch}"}
    est = star_estimate(cfg, world_size, learner, buffer, actor, worker, slot, params, parts=parts)
    est.fixes.update(fixes)
    return est


class _Obs:
    """The spaces :func:`~mpirl.envs.games.step_spec` reads."""

    def __init__(self, obs_shape, obs_dtype):
        self.obs_shape, self.obs_dtype = tuple(obs_shape), obs_dtype


def check(cfg: JobConfig, world_size: int, job_path: str) -> Checked:
    from mpirl.agents.actor_critic import trajectory_spec
    check_world_size(cfg, world_size, job_path)
    n_act, t = actor_count(cfg, world_size), cfg.topology
    if n_act < 1:
        raise ConfigError("world size", f"the job needs at least one actor, the MPI world has {world_size} rank(s); "
                                        f"run: mpirl launch -n {world_size + 1} {job_path}")
    if t.worker_ranks and t.worker_ranks % t.buffers:
        raise ConfigError("topology.workers", f"IMPALA's queues each need the same number of senders: "
                                              f"{t.worker_ranks} workers do not spread evenly over {t.buffers} "
                                              f"buffer(s); set topology.workers to a multiple of topology.buffers")
    if not t.served and t.buffers and n_act % t.buffers:
        raise ConfigError("world size", f"IMPALA's queues each need the same number of actors: {n_act} actor(s) do "
                                        f"not spread evenly over {t.buffers} buffer(s); run with "
                                        f"{1 + t.buffers + n_act + t.buffers - n_act % t.buffers} ranks, or set "
                                        f"topology.actors to a multiple of topology.buffers")
    i = cfg.impala
    if len(i.actor_delay_us) not in (1, n_act):
        raise ConfigError("impala.actor_delay_us", f"must hold one value for every actor or one per actor ({n_act}), "
                                                   f"got {len(i.actor_delay_us)}: {i.actor_delay_us}")
    if i.exchange == "sync" and cfg.replay.batch_size != n_act * cfg.env.envs_per_actor:
        raise ConfigError("replay.batch_size", f"with impala.exchange = \"sync\" a batch is one round, a trajectory "
                                               f"of every game of every actor: {n_act} actor(s) x "
                                               f"{cfg.env.envs_per_actor} games = {n_act * cfg.env.envs_per_actor}; "
                                               f"set replay.batch_size = {n_act * cfg.env.envs_per_actor}, got "
                                               f"{cfg.replay.batch_size}")
    spaces = actor_critic_spaces(cfg, "IMPALA", TEAMS)
    spec = trajectory_spec(spaces.obs_shape, spaces.obs_dtype, cfg.impala.unroll, spaces.action,
                           returns=cfg.agent.normalize_reward,
                           state_size=cfg.agent.hidden[-1] if cfg.agent.recurrent == "lstm" else 0)
    n_params = actor_critic_params(spaces, cfg) + normalization_values(spaces, cfg)  # the statistics travel too
    # The broadcast carries the version after the parameters (mpirl.algos.impala.learner).
    return Checked(spaces, spec, n_params + 1, estimate(cfg, world_size, spec, n_params))


ROLES: dict[str, RoleLoop] = roles(ImpalaBuilder())


def layout(cfg: JobConfig, world_size: int) -> Layout:
    """The replay algorithms' layout (:mod:`mpirl.actor_learner.replay_layout`), or with ``topology.buffers = 0`` the
    learner and its actors alone: experience straight into the learner, parameters straight to the actors. Under
    ``impala.exchange = "async"`` the senders' parameters go to each on its own (``Link.each``): a broadcast would
    move at the pace of the slowest actor, and IMPALA's actors run at their own."""
    if cfg.topology.buffers:
        lay = replay_layout.layout(cfg, world_size)
    else:
        lay = Layout({LEARNER: (0,), ACTOR: tuple(range(1, world_size))},
                     (Link("experience", ACTOR, LEARNER), Link("parameters", LEARNER, ACTOR, hub="source")))
    if cfg.impala.exchange == "sync":  # a round: everyone waits for the same parameters anyway
        return lay
    experience = lay.link("experience")
    assert experience is not None
    hub = experience.target  # who receives the senders' trajectories sends them their parameters
    return Layout(lay.ranks, tuple(replace(k, each=True) if k.kind == "parameters" and k.source == hub else k
                                   for k in lay.links))


def build_topology(world: MPI.Comm, cfg: JobConfig) -> Topology:
    return build(world, layout(cfg, world.size), cfg.topology.node_local)


def rank_files(topo: Topology) -> dict[str, str]:
    """The replay layout's files; with the queue on the learner its intake writes ``buffer_0.h5``."""
    if topo.learner is None:
        return {"learner": "learner.h5", "buffer_0": "buffer_0.h5"}
    return replay_layout.rank_files(topo)


def role_map(topo: Topology) -> str:
    if topo.learner is None:
        actors = sorted(topo.buffer_of)
        if len(actors) == 1:
            return "0 learner and queue; 1 actor"
        return f"0 learner and queue; {actors[0]}-{actors[-1]} actors"
    return replay_layout.role_map(topo)


def describe(cfg: JobConfig, world_size: int, checked: Checked) -> str:
    s, t, rp = checked.spaces, cfg.topology, cfg.replay
    queues = f"{t.buffers} queue(s)" if t.buffers else "its queue"
    return (f"1 learner, {queues}{inference(t)}, {actor_count(cfg, world_size)} actor(s); IMPALA (V-trace, "
            f"{cfg.impala.exchange}) on "
            f"{cfg.env.id}: obs {s.obs_shape} {s.obs_dtype}, {s.action.describe()}"
            f"{', an LSTM core' if cfg.agent.recurrent == 'lstm' else ''}; trajectories of "
            f"{cfg.impala.unroll} steps, batch {rp.batch_size} trajectories, queues of {rp.capacity}")


def summary(run_dir: Path) -> str:
    from mpirl.algos.impala.info import format_summary, summarize
    return format_summary(summarize(run_dir))
