"""On paper: the gradient family's updates/s and scaling efficiency on a cluster network, from costs measured here.

Pure arithmetic (numpy; no MPI, no torch), printed by ``mpirl bench gradients`` as "projected, not measured". The inputs
are measured on this machine: ``compute_s`` (a worker's time to play a rollout and compute its gradient) and
``apply_s`` (one optimizer step on the flat gradient); the network is a model: a message of ``b`` bytes costs
``latency + b / bandwidth``.

* **allreduce** (DD-PPO): every worker computes a gradient, the ring allreduce averages them, every worker steps
  its optimizer; nothing overlaps. A ring allreduce of ``S`` bytes over ``W`` ranks is ``2 (W - 1)`` steps, each
  moving ``S / W`` bytes on every link at once: ``2 (W - 1) (latency + S / (W bandwidth))``. An update averages
  ``W`` gradients: ``updates/s = 1 / (compute + ring + apply)``, ``gradients/s = W x updates/s``.
* **async** (a parameter server): an update is one worker's gradient in and the new parameters out. The server's
  link carries, per update, one message in and one reply out, one after the other (not overlapped: a conservative
  bound; a full-duplex link could overlap them), and the server applies each gradient: it is busy
  ``server = 2 latency + (message + reply) / bandwidth + apply`` per update, so at most ``1 / server`` updates/s.
  A worker waits for its reply before its next rollout: each of the ``W`` workers turns over one gradient per
  ``compute + server`` seconds. ``updates/s = gradients/s = min(W / (compute + server), 1 / server)``.

* **stragglers**: an allreduce waits for its slowest worker. Where the one worker's compute per gradient was
  measured rollout by rollout (``Costs.compute_samples``), the compute of an update is the expected largest of ``W``
  draws of it (bootstrapped), not its mean: the straggler effect DD-PPO's preemption threshold answers.

Speed-up is gradients (samples) per second over one worker alone (no messages: ``1 / (compute + apply)``);
efficiency is speed-up / W. DD-PPO (Wijmans et al. 2020, "DD-PPO: Learning Near-Perfect PointGoal Navigators from
2.5 Billion Frames") published a 107x speed-up on 128 GPUs over a serial implementation: efficiency 0.84,
the reference line.

**On this machine** (``local_*``): the same model with what a laptop or one node changes, checked against the
jobs measured here before it projects (``mpirl bench gradients``, scaling model vs measured, within 20 %). The
network is the local transport, measured (our allreduce of the buffer on W ranks, ``ring_s``); the ranks may
outnumber the cores, so each busy rank computes at ``share`` of a core alone's speed (measured with n ranks busy,
:mod:`mpirl.bench.busy_cores_job`); the one worker's times are measured by its job (W = 1):

* allreduce, W ranks: ``1 / ((largest of W computes + exchange) / share(W) + ring(W))``, ``exchange`` the W = 1
  worker's time in its exchange per gradient (the optimizer step and the bookkeeping, no peers);
* async, W workers and a server: ``min(W / (compute / share(W) + turnaround), capacity / (compute + server))``,
  ``turnaround`` the W = 1 worker's wait for the reply to each gradient (its message, the server's step, the reply),
  ``server`` the W = 1 server's seconds handling a gradient, ``capacity`` the cores' worth of the busy ranks
  (``n x share(n)``, n the larger of W and the cores): the workers' cycles, or the cores shared by the workers and
  the server, whichever binds;
* K data-parallel learners, the learners alone: ``1 / (part + ring(K))``, ``part`` the time of one K-th of the batch's
  train step with K ranks busy (measured), ``ring`` our allreduce of the gradient on K ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

WORKERS = (8, 16, 32, 64, 128)
DDPPO_GPUS, DDPPO_SPEEDUP = 128, 107.0  # Wijmans et al. 2020 (ICLR), its abstract


@dataclass(frozen=True)
class Fabric:
    name: str
    gbit_s: float  # link bandwidth, Gb/s
    latency_s: float  # one message's latency

    @property
    def bytes_s(self) -> float:
        return self.gbit_s * 1e9 / 8


NOT_MEASURED = "projected, not measured"
FABRICS = (Fabric("25 GbE", 25.0, 25e-6), Fabric("InfiniBand HDR", 200.0, 1.5e-6))


@dataclass(frozen=True)
class Costs:
    """What one network's gradient costs: measured times, and the sizes on the wire."""
    compute_s: float  # a worker's rollout and gradient
    apply_s: float  # one optimizer step
    grad_bytes: int  # the flat float32 gradient: 4 x parameters
    message_bytes: int  # a worker's message to the server (header, episodes, gradient)
    reply_bytes: int  # the server's reply (header, parameters)
    compute_samples: tuple[float, ...] = ()  # compute_s rollout by rollout, where measured (stragglers)


class Projection(NamedTuple):
    updates_s: float
    gradients_s: float
    speedup: float  # gradients/s over one worker alone
    efficiency: float  # speed-up / W


def message_s(nbytes: float, fabric: Fabric) -> float:
    return fabric.latency_s + nbytes / fabric.bytes_s


def ring_allreduce_s(nbytes: float, W: int, fabric: Fabric) -> float:
    """A ring allreduce of ``nbytes`` over ``W`` ranks: ``2 (W - 1)`` steps of ``nbytes / W`` on every link."""
    return 2 * (W - 1) * message_s(nbytes / W, fabric) if W > 1 else 0.0


def ring_bytes_per_rank(nbytes: float, W: int) -> float:
    """Bytes a rank sends (and receives) in a ring allreduce of ``nbytes``: ``2 (W - 1) / W x nbytes``."""
    return 2 * (W - 1) / W * nbytes


def server_busy_s(c: Costs, fabric: Fabric) -> float:
    """The parameter server's time per update: a message in, a reply out (serialised), an optimizer step."""
    return message_s(c.message_bytes, fabric) + message_s(c.reply_bytes, fabric) + c.apply_s


def _projection(c: Costs, W: int, gradients_s: float, updates_s: float) -> Projection:
    speedup = gradients_s * (c.compute_s + c.apply_s)
    return Projection(updates_s, gradients_s, speedup, speedup / W)


def lockstep_s(samples, W: int, draws: int = 4000, seed: int = 0) -> float:
    """The expected largest of ``W`` computes drawn from ``samples`` (bootstrapped with a fixed seed): what a
    lockstep update of ``W`` workers waits for."""
    x = np.asarray(samples, np.float64)
    if W <= 1 or len(x) < 2:
        return float(x.mean())
    idx = np.random.default_rng(seed).integers(0, len(x), (draws, W))
    return float(x[idx].max(axis=1).mean())


def update_compute_s(c: Costs, W: int) -> float:
    """The compute a lockstep update of ``W`` workers waits for: its slowest's, where samples were measured."""
    return lockstep_s(c.compute_samples, W) if c.compute_samples else c.compute_s


def allreduce(c: Costs, W: int, fabric: Fabric) -> Projection:
    updates = 1.0 / (update_compute_s(c, W) + ring_allreduce_s(c.grad_bytes, W, fabric) + c.apply_s)
    return _projection(c, W, W * updates, updates)


def server(c: Costs, W: int, fabric: Fabric) -> Projection:
    busy = server_busy_s(c, fabric)
    updates = min(W / (c.compute_s + busy), 1.0 / busy)
    return _projection(c, W, updates, updates)


EXCHANGES = {"allreduce": allreduce, "async": server}


def local_allreduce(compute_samples, exchange_s: float, W: int, share: float, ring_s: float) -> float:
    """Updates/s of ``W`` allreduce workers on this machine (module docstring, "On this machine")."""
    return 1.0 / ((lockstep_s(compute_samples, W) + exchange_s) / share + ring_s)


def local_async(compute_samples, turnaround_s: float, W: int, share: float, server_s: float,
                capacity: float) -> float:
    """Updates/s (= gradients/s) of ``W`` asynchronous workers and a server on this machine: each worker's cycle,
    or the cores' capacity (in cores at a lone rank's speed) over what a gradient costs the worker and the server."""
    compute = float(np.mean(compute_samples))
    return min(W / (compute / share + turnaround_s), capacity / (compute + server_s))


def local_learners(part_s: float, ring_s: float) -> float:
    """Train steps/s of K data-parallel learners on this machine: a K-th of the step with K ranks busy, and the sum."""
    return 1.0 / (part_s + ring_s)


def project(c: Costs, W: int, fabric: Fabric, exchange: str) -> Projection:
    return EXCHANGES[exchange](c, W, fabric)


def table(nets: dict[str, Costs], workers=WORKERS, fabrics=FABRICS, exchanges=tuple(EXCHANGES)) -> str:
    """The projection for every network, fabric, exchange and worker count, with DD-PPO's line at the end."""
    lines = [f"{NOT_MEASURED}: the gradient family on a cluster network, from the costs measured above",
             "  (a message: latency + bytes / bandwidth; allreduce: ring; async: one parameter server, its link",
             "  serialising a message in and a reply out per update; speed-up: gradients/s over one worker alone)"]
    for name, c in nets.items():
        slowest = (f" (the slowest of {max(workers)}: {1e3 * update_compute_s(c, max(workers)):.3g} ms)"
                   if c.compute_samples else " (no spread measured)")
        lines.append(f"  {name}: {c.grad_bytes:,} B a gradient, compute {1e3 * c.compute_s:.3g} ms a gradient"
                     f"{slowest}, apply {1e3 * c.apply_s:.3g} ms; message {c.message_bytes:,} B + reply "
                     f"{c.reply_bytes:,} B")
    lines.append(f"  {'network':14s} {'fabric':15s} {'exchange':9s} {'W':>4s} {'updates/s':>11s} {'gradients/s':>12s} "
                 f"{'speed-up':>9s} {'efficiency':>10s}")
    for name, c in nets.items():
        for f in fabrics:
            for ex in exchanges:
                for W in workers:
                    p = project(c, W, f, ex)
                    lines.append(f"  {name[:14]:14s} {f.name:15s} {ex:9s} {W:4d} {p.updates_s:11,.1f} "
                                 f"{p.gradients_s:12,.1f} {p.speedup:9.1f} {p.efficiency:10.2f}   {NOT_MEASURED}")
    lines.append(f"  reference: DD-PPO (Wijmans et al. 2020), published: {DDPPO_SPEEDUP:g}x on {DDPPO_GPUS} GPUs, "
                 f"efficiency {DDPPO_SPEEDUP / DDPPO_GPUS:.2f} (measured by its authors; ResNet agents in Habitat)")
    return "\n".join(lines)
