"""Ape-X's memory estimate per rank: the replay memories from the record spec and capacity (frames stored once:
about one 84x84 frame a slot), the message buffers from their layouts, the learner's networks, optimizer state and
activations from the network itself (see :mod:`mpirl.job.memory` for the constants and the check)."""

from __future__ import annotations

import math

import numpy as np

from mpirl.comm.messages import experience_layout, request_layout, sample_layout
from mpirl.config import JobConfig
from mpirl.replay_job import actor_count
from mpirl.replay.frame_cache import cache_slots
from mpirl.replay.frame_stream import window_frames
from mpirl.replay.frames import framed_fields
from mpirl.replay.quotas import max_quota
from mpirl.job.memory import ATARI, NUMBA, PROCESS, SLOT_INDEX, TRAINING, FRAMES_PER_SLOT, Estimate
from mpirl.actor_learner.replay_layout import ACTOR, BUFFER, LEARNER, WORKER, sender_count, star_estimate


def _slot_bytes(spec: dict, dedup: bool) -> float:
    framed = framed_fields(spec) if dedup else {}
    total = float(SLOT_INDEX)
    for name, (shape, dtype) in spec.items():
        if name in framed:
            total += 4 * framed[name][0]  # int32 frame indices
        else:
            total += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if framed:
        frame = next(iter(framed.values()))[1]
        total += FRAMES_PER_SLOT * int(np.prod(frame))
    return total


REAL_FORWARD_BYTES = 64 * 2**20  # a network up to this size is counted by a real forward pass (below)


def _network_bytes(obs_shape: tuple, n_actions: int, hidden: list, choice: str, batch: int,
                   real_up_to: int = REAL_FORWARD_BYTES) -> tuple[int, int]:
    """(parameters in bytes, activations of one training batch in bytes) of the job's network.

    The network is first built on torch's meta device (nothing is allocated, so a network no node can hold is
    refused by its size, not by building it). Its activations are then counted over a forward pass of two
    observations: on the CPU when its parameters fit in ``real_up_to`` bytes (every rank of every job runs this
    check; torch's first meta forward pass costs a second of CPU loading its decompositions, a real one of a
    small network nothing), on the meta device otherwise. Both passes see the same output shapes."""
    import torch

    from mpirl.agents.networks import build_network, parameter_count, shapes_only
    build = lambda: build_network(obs_shape, n_actions, hidden, choice)  # noqa: E731
    net = shapes_only(build)
    params = parameter_count(net) * 4
    device = "cpu" if params <= real_up_to else "meta"
    if device == "cpu":
        with torch.random.fork_rng(devices=[]):  # the rank's random streams stay as they were
            net = build()
    outputs: list[int] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: outputs.append(out.numel() // 2))
             for m in net.modules() if not list(m.children())]
    with torch.no_grad():
        net(torch.zeros((2, *obs_shape), device=device))
    for h in hooks:
        h.remove()
    # The batch's forward pass with its gradients, the target passes, and obs/next_obs as float32.
    per_sample = 3 * sum(outputs) * 4 + 2 * int(np.prod(obs_shape)) * 4
    return params, per_sample * batch


def estimate(cfg: JobConfig, world_size: int, obs_shape: tuple, obs_dtype, n_actions: int) -> Estimate:
    from mpirl.agents.dqn import transition_spec
    spec = transition_spec(obs_shape, obs_dtype)
    rp, c, t = cfg.replay, cfg.comm, cfg.topology
    n_buf, n_act = t.buffers, actor_count(cfg, world_size)
    slot = _slot_bytes(spec, rp.dedup_frames)
    memory = int(slot * rp.capacity)
    share = max_quota(rp.batch_size, n_buf, rp.shares)
    framed = framed_fields(spec) if rp.dedup_frames else {}
    senders = t.worker_ranks or int(t.on_learner) or n_act
    actors_per_buffer = math.ceil(senders / n_buf)  # ranks sending to a buffer
    games = cfg.env.envs_per_actor * (math.ceil(n_act / senders) if t.served else 1)  # stepped by one sender
    message = experience_layout(spec, c.send_batch, framed, games).max_nbytes
    params, activations = _network_bytes(obs_shape, n_actions, cfg.agent.hidden, cfg.agent.network,
                                         rp.batch_size)
    network = 5 * params + activations  # online, target, gradients, Adam's two moments
    proposed = rp.architecture == "proposed"
    process = PROCESS + (ATARI if cfg.env.id.startswith("ALE/") else 0)
    cache_bytes = 0
    if proposed:
        cache = cache_slots(rp.frame_cache, rp.capacity, framed)
        replies = (c.prefetch + 1) * sample_layout(spec, share, framed, cache=bool(cache)).max_nbytes
        buffer = process + NUMBA + memory + actors_per_buffer * c.recv_depth * message + replies
        learner = process + TRAINING + network + n_buf * (replies + request_layout(share).max_nbytes)
        if cache:  # the learner's frame cache (on its device; counted here as if on its host) and each mirror
            frame = int(np.prod(next(iter(framed.values()))[1]))
            cache_bytes = (n_buf * cache + n_buf * share * sum(d for d, _ in framed.values())) * frame
            learner += cache_bytes
            buffer += 16 * cache
    else:
        dump = int(slot * rp.capacity)  # a dump fills about what the memory holds (frames once)
        buffer = process + memory + dump + actors_per_buffer * c.recv_depth * message
        learner = process + NUMBA + TRAINING + network + n_buf * (memory + dump)
    if t.served:
        from mpirl.envs.games import step_spec
        from mpirl.comm.messages import step_layout
        step = step_layout(step_spec(_Obs(obs_shape, obs_dtype)), cfg.env.envs_per_actor).max_nbytes
        served = math.ceil(n_act / max(t.worker_ranks, 1))
        # A worker: the network and its priorities' pass, its send ring, each actor's messages and n-step windows.
        worker = (PROCESS + c.send_ring * message + 3 * params + 3 * served * step
                  + served * cfg.env.envs_per_actor * (cfg.apex.n_step + 1) * int(np.prod(obs_shape)))
        actor = process + 3 * step  # its games and its step messages
    else:
        worker = 0
        actor = process + c.send_ring * message + 3 * params
    if t.on_learner:  # the learner's rank is the worker
        learner, worker = learner + worker - PROCESS, 0
    # The frame pool reserves room for no sharing at all (touched only as frames arrive), and a buffer's also for
    # its senders' windows; the kernel refuses a reservation beyond its RAM and swap. The baseline learner's pool
    # holds every buffer's memory.
    pool = 0
    if framed:
        frame = int(np.prod(next(iter(framed.values()))[1]))
        pool = rp.capacity * sum(d for d, _ in framed.values()) * frame * (1 if proposed else n_buf)
        pool = max(pool, (rp.capacity * sum(d for d, _ in framed.values())
                          + actors_per_buffer * window_frames(c.send_batch, games, cfg.apex.n_step, framed)) * frame)
    inbox = actors_per_buffer * c.recv_depth * message  # a buffer's receives, one ring per sender
    key = "agent.hidden"
    parts = {BUFFER: {"replay.capacity": memory if proposed else memory + dump, sender_count(cfg): inbox},
             LEARNER: {key: network, "replay.frame_cache": cache_bytes,
                       "replay.capacity": 0 if proposed else n_buf * (memory + dump)},
             ACTOR: {key: 0 if t.served else 3 * params}, WORKER: {key: 3 * params if t.served else 0}}
    return star_estimate(cfg, world_size, learner, buffer, actor, worker, slot, params, pool, cache_bytes=cache_bytes,
                         parts=parts)


class _Obs:
    """The spaces :func:`~mpirl.envs.games.step_spec` reads."""

    def __init__(self, obs_shape, obs_dtype):
        self.obs_shape, self.obs_dtype = obs_shape, obs_dtype
