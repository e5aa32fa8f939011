"""QMIX behind the algorithm seam: its checks, roles, rank files and validate line.

The ranks are Ape-X's (0 the learner, then the buffers, then the actors; :mod:`mpirl.comm.topology`)
and so are the paths: actors send whole episodes to their buffer, buffers hold episode shards
(``replay.architecture = "proposed"``) or relay them (``"baseline"``: the learner keeps the replay),
and parameters come down in versioned broadcasts. Records: one episode per row
(:func:`mpirl.agents.qmix.episode_spec`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from mpirl.algos.qmix.builder import QmixBuilder
from mpirl.algos.qmix.envs import Spaces, spaces_of  # noqa: F401 - the job's spaces, as the checks find them
from mpirl.comm.messages import dump_layout, experience_layout, request_layout, sample_layout
from mpirl.job.contract import Checked, RoleLoop
from mpirl.config import ConfigError, JobConfig
from mpirl.replay_job import actor_count, check_world_size, learners
from mpirl.replay.quotas import max_quota
from mpirl.job import memory
from mpirl.actor_learner.replay_layout import (BUFFER, LEARNER, build_topology, inference, layout,  # noqa: F401
                                              rank_files, role_map, roles, sender_count, star_estimate)


# The settings that size QMIX's networks (MAC-PO's central mixer only with qmix.loss_weights = "macpo").
NETWORK_KEYS = ("rnn_hidden", "mixer_embed", "hypernet_hidden", "central_hidden")


class Networks(NamedTuple):
    agent: int  # the agent network's parameters: what every broadcast carries
    total: int  # every network the learner trains (agent, mixer, MAC-PO's central mixer)
    key: str  # the setting that makes them big: the one whose shrinking to 1 would shrink them most


def _networks(spaces: Spaces, cfg: JobConfig) -> Networks:
    """The job's QMIX networks counted on torch's meta device (nothing is allocated: a network no node can hold
    is refused by the memory check with the setting that sizes it, not by building it)."""
    from mpirl.agents.networks import parameter_count, shapes_only
    from mpirl.agents.qmix import QmixHyper
    from mpirl.agents.qmix_learner import QMixLearner
    q = cfg.qmix

    def count(**change) -> tuple[int, int]:
        widths = {k: change.get(k, getattr(q, k)) for k in NETWORK_KEYS}
        hp = QmixHyper(loss_weights=q.loss_weights, **widths)
        learner = shapes_only(lambda: QMixLearner(spaces.n_agents, spaces.obs_shape, spaces.state_shape,
                                                  spaces.n_actions, hp, device="meta"))
        return learner.n_params, parameter_count(learner.agent, learner.mixer, learner.central)

    agent, total = count()
    keys = [k for k in NETWORK_KEYS if k != "central_hidden" or q.loss_weights == "macpo"]
    key = min(keys, key=lambda k: count(**{k: 1})[1])
    return Networks(agent, total, f"qmix.{key}")


def estimate(cfg: JobConfig, world_size: int, spaces: Spaces, spec: dict, nets: Networks):
    """Each rank's memory: episode slots from the spec, messages from their layouts, the networks, and the
    learner's batch (its activations over B episodes x T+1 steps x n agents)."""
    rp, c, t = cfg.replay, cfg.comm, cfg.topology
    n_buf, n_act = t.buffers, actor_count(cfg, world_size)
    slot = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in spec.values()) + 16
    share = max_quota(rp.batch_size, n_buf, "even")
    message = experience_layout(spec, c.send_batch).max_nbytes
    rows = rp.batch_size * (spaces.episode_limit + 1) * spaces.n_agents
    # Per agent-step: float inputs, GRU and layer outputs with gradients, online and target passes (~8 x H floats).
    activations = rows * (4 * (int(np.prod(spaces.obs_shape)) + spaces.n_actions + spaces.n_agents)
                          + 8 * 4 * cfg.qmix.rnn_hidden)
    batch = 2 * rp.batch_size * slot  # the batch as numpy and as tensors
    n_params = nets.agent
    network = 5 * 4 * nets.total + activations + batch
    per_buffer = math.ceil((t.worker_ranks or int(t.on_learner) or n_act) / n_buf)  # the ranks sending to one buffer
    if rp.architecture == "proposed":
        replies = (c.prefetch + 1) * sample_layout(spec, share).max_nbytes
        buffer = memory.PROCESS + slot * rp.capacity + per_buffer * c.recv_depth * message + replies
        learner = (memory.PROCESS + memory.TRAINING + network
                   + n_buf * (replies + request_layout(share).max_nbytes))
    else:
        dump = dump_layout(spec, rp.capacity).max_nbytes
        buffer = memory.PROCESS + slot * rp.capacity + dump + per_buffer * c.recv_depth * message
        learner = memory.PROCESS + memory.TRAINING + network + n_buf * (slot * rp.capacity + dump)
    E = cfg.env.envs_per_actor
    if t.served:
        from mpirl.algos.qmix.playing import step_spec
        from mpirl.comm.messages import step_layout
        served = math.ceil(n_act / max(t.worker_ranks, 1))
        step = step_layout(step_spec(spaces), E).max_nbytes
        # A worker: its actors' episodes being recorded and staged, its send ring, the network, their messages.
        worker = (memory.PROCESS + (2 * served * E + c.send_batch) * slot + c.send_ring * message
                  + 3 * 4 * n_params + 3 * served * step)
        actor = memory.PROCESS + 3 * step  # its games and its step messages
    else:
        # An actor: its games' episodes being recorded, its staging and send ring, its copy of the agent network.
        worker = 0
        actor = (memory.PROCESS + (E + c.send_batch) * slot + c.send_ring * message + 3 * 4 * n_params)
    if t.on_learner:  # the learner's rank is the worker
        learner, worker = learner + worker - memory.PROCESS, 0
    inbox = per_buffer * c.recv_depth * message  # a buffer's receives, one ring per sender
    held = slot * rp.capacity + (0 if rp.architecture == "proposed" else dump)
    parts = {BUFFER: {"replay.capacity": held, sender_count(cfg): inbox},
             LEARNER: {nets.key: network, "replay.capacity": 0 if rp.architecture == "proposed" else n_buf * held}}
    return star_estimate(cfg, world_size, learner, buffer, actor, worker, slot, 4 * nets.total, network_key=nets.key,
                         parts=parts)


def check(cfg: JobConfig, world_size: int, job_path: str) -> Checked:
    from mpirl.agents.qmix import episode_spec
    check_world_size(cfg, world_size, job_path)
    spaces = spaces_of(cfg)
    spec = episode_spec(spaces.n_agents, spaces.obs_shape, spaces.obs_dtype, spaces.state_shape,
                        spaces.state_dtype, spaces.n_actions, spaces.episode_limit)
    nets = _networks(spaces, cfg)
    return Checked(spaces, spec, nets.agent, estimate(cfg, world_size, spaces, spec, nets))



ROLES: dict[str, RoleLoop] = roles(QmixBuilder())




def describe(cfg: JobConfig, world_size: int, checked: Checked) -> str:
    s, t, rp = checked.spaces, cfg.topology, cfg.replay
    variant = {("none", "uniform"): "QMIX", ("macpo", "uniform"): "MAC-PO", ("macpo", "accmer"): "AccMER"}[
        (cfg.qmix.loss_weights, cfg.qmix.sampler)]
    workers = inference(t)
    return (f"{learners(t)}, {t.buffers} buffer(s){workers}, {actor_count(cfg, world_size)} actor(s); {variant} on "
            f"{cfg.env.id}: {s.n_agents} agents, obs {s.obs_shape} {s.obs_dtype}, state {s.state_shape}, "
            f"{s.n_actions} actions, episodes of up to {s.episode_limit} steps; replay {rp.architecture}, "
            f"batch {rp.batch_size} episodes, capacity {rp.capacity} episodes "
            f"({checked.memory.slot_bytes / 2**10:,.0f} KiB each)")


def summary(run_dir: Path) -> str:
    from mpirl.algos.qmix.info import format_summary, summarize
    return format_summary(summarize(run_dir))
