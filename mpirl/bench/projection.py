"""On paper: the gradient family's updates/s and scaling efficiency on a cluster network, from costs measured here.

Pure arithmetic (no MPI, no torch), printed by ``mpirl bench gradients`` as "projected, not measured". The inputs
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

Speed-up is gradients (samples) per second over one worker alone (no messages: ``1 / (compute + apply)``);
efficiency is speed-up / W. DD-PPO (Wijmans et al. 2020, "DD-PPO: Learning Near-Perfect PointGoal Navigators from
2.5 Billion Frames") published a 107x speed-up on 128 GPUs over a serial implementation: efficiency 0.84,
the reference line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

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


def allreduce(c: Costs, W: int, fabric: Fabric) -> Projection:
    updates = 1.0 / (c.compute_s + ring_allreduce_s(c.grad_bytes, W, fabric) + c.apply_s)
    return _projection(c, W, W * updates, updates)


def server(c: Costs, W: int, fabric: Fabric) -> Projection:
    busy = server_busy_s(c, fabric)
    updates = min(W / (c.compute_s + busy), 1.0 / busy)
    return _projection(c, W, updates, updates)


EXCHANGES = {"allreduce": allreduce, "async": server}


def project(c: Costs, W: int, fabric: Fabric, exchange: str) -> Projection:
    return EXCHANGES[exchange](c, W, fabric)


def table(nets: dict[str, Costs], workers=WORKERS, fabrics=FABRICS, exchanges=tuple(EXCHANGES)) -> str:
    """The projection for every network, fabric, exchange and worker count, with DD-PPO's line at the end."""
    lines = [f"{NOT_MEASURED}: the gradient family on a cluster network, from the costs measured above",
             "  (a message: latency + bytes / bandwidth; allreduce: ring; async: one parameter server, its link",
             "  serialising a message in and a reply out per update; speed-up: gradients/s over one worker alone)"]
    for name, c in nets.items():
        lines.append(f"  {name}: {c.grad_bytes:,} B a gradient, compute {1e3 * c.compute_s:.3g} ms a gradient, "
                     f"apply {1e3 * c.apply_s:.3g} ms; message {c.message_bytes:,} B + reply {c.reply_bytes:,} B")
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
