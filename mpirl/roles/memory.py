"""How much memory each rank of a job will hold, estimated before any rank starts, and the check against a node.

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

import math
import os
from dataclasses import dataclass

import numpy as np

from mpirl.comm.messages import dump_layout, experience_layout, request_layout, sample_layout
from mpirl.config import ConfigError, JobConfig, actor_count
from mpirl.replay.frames import framed_fields
from mpirl.replay.quotas import max_quota

MB = 2**20
PROCESS = 180 * MB  # a rank's private memory with its imports (torch included), before the job's own arrays
LIBRARIES = 140 * MB  # the imported libraries' file-backed pages, shared by the ranks of a node: counted once
ATARI = 45 * MB  # ale-py, on every rank of an Atari job (each checks the environment before it starts)
NUMBA = 45 * MB  # the compiled sum tree's compiler and kernels (buffers; the baseline learner)
TRAINING = 80 * MB  # torch's autograd and optimizer machinery on the learner
FRAMES_PER_SLOT = 1.25  # distinct frames a slot holds with frames stored once (one a step, plus resets)
SLOT_INDEX = 16 + 4 + 8  # sum tree leaf and its share of the inner nodes, raw priority, version


@dataclass
class Estimate:
    """Bytes per rank of each role; ``parts`` says what dominates, for the message."""
    learner: int
    buffer: int
    actor: int
    buffers: int
    actors: int
    slot_bytes: float
    network_bytes: int
    reserved: int = 0  # the largest single reservation (the frame pool's worst case), touched or not

    def total(self) -> int:
        """All ranks on one node."""
        return LIBRARIES + self.learner + self.buffers * self.buffer + self.actors * self.actor

    def text(self) -> str:
        return (f"learner {self.learner / 2**30:.1f} GiB, {self.buffers} buffer(s) {self.buffer / 2**30:.1f} GiB "
                f"each, {self.actors} actor(s) {self.actor / 2**30:.2f} GiB each")

    def fix(self, cfg: JobConfig) -> tuple[str, str]:
        """The field to name and the fix, by what dominates the estimate."""
        replay = self.slot_bytes * cfg.replay.capacity
        if replay >= self.network_bytes:
            return ("replay.capacity", f"lower replay.capacity (now {cfg.replay.capacity:,}; about "
                                       f"{self.slot_bytes / 1024:,.1f} KiB a slot), or run the ranks on more nodes")
        return ("agent.hidden", f"use a smaller network (agent.hidden, now {cfg.agent.hidden}) or a bigger node")


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


def _network_bytes(obs_shape: tuple, n_actions: int, hidden: list, batch: int) -> tuple[int, int]:
    """(parameters in bytes, activations of one training batch in bytes) of the job's network."""
    import torch

    from mpirl.agents.networks import build_network
    net = build_network(obs_shape, n_actions, hidden)
    params = sum(p.numel() for p in net.parameters()) * 4
    outputs: list[int] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: outputs.append(out.numel() // 2))
             for m in net.modules() if not list(m.children())]
    with torch.no_grad():
        net(torch.zeros((2, *obs_shape)))
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
    message = experience_layout(spec, c.send_batch).max_nbytes
    actors_per_buffer = math.ceil(n_act / n_buf)
    params, activations = _network_bytes(obs_shape, n_actions, cfg.agent.hidden, rp.batch_size)
    network = 5 * params + activations  # online, target, gradients, Adam's two moments
    proposed = rp.architecture == "proposed"
    process = PROCESS + (ATARI if cfg.env.id.startswith("ALE/") else 0)
    if proposed:
        replies = (c.prefetch + 1) * sample_layout(spec, share).max_nbytes
        buffer = process + NUMBA + memory + actors_per_buffer * c.recv_depth * message + replies
        learner = process + TRAINING + network + n_buf * (replies + request_layout(share).max_nbytes)
    else:
        dump = int(slot * rp.capacity)  # a dump fills about what the memory holds (frames once)
        buffer = process + memory + dump + actors_per_buffer * c.recv_depth * message
        learner = process + NUMBA + TRAINING + network + n_buf * (memory + dump)
    actor = process + c.send_ring * message + 3 * params
    framed = framed_fields(spec) if rp.dedup_frames else {}
    # The frame pool reserves room for no sharing at all (touched only as frames arrive); the kernel refuses
    # a reservation beyond its RAM and swap. The baseline learner's pool holds every buffer's memory.
    pool = 0
    if framed:
        frame = int(np.prod(next(iter(framed.values()))[1]))
        pool = rp.capacity * sum(d for d, _ in framed.values()) * frame * (1 if proposed else n_buf)
    return Estimate(int(learner), int(buffer), int(actor), n_buf, n_act, slot, params, pool)


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


def reservable_bytes() -> int | None:
    """RAM plus swap: the most one allocation may reserve under Linux's default overcommit heuristic."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
        return info["MemTotal"] + info.get("SwapTotal", 0)
    except (OSError, KeyError, ValueError, IndexError):
        return None


def check_fits(cfg: JobConfig, est: Estimate, need: int, where: str, available: int | None) -> None:
    """ConfigError naming the field and the fix when ``need`` bytes do not fit in ``available``."""
    limit = reservable_bytes()
    if limit is not None and est.reserved > limit:
        raise ConfigError("replay.capacity", f"the frame pool of {cfg.replay.capacity:,} slots reserves "
                          f"{est.reserved / 2**30:.1f} GiB (room for no frame shared) and a node has "
                          f"{limit / 2**30:.1f} GiB of RAM and swap; lower replay.capacity")
    if available is None or need <= available:
        return
    key, fix = est.fix(cfg)
    raise ConfigError(key, f"the job needs about {need / 2**30:.1f} GiB on {where} ({est.text()}), "
                           f"{available / 2**30:.1f} GiB are available; {fix}")
