"""An emulated long-haul link: bandwidth and one-way latency for the messages one rank sends.

The sender holds each message back until it would have *arrived* over the
emulated link: it departs when the link is free, occupies the link for
``bytes / bandwidth`` seconds, then travels ``latency`` seconds. Releasing the
real (local) send at that moment makes the receiver see the emulated arrival
time, so one machine can stand in for 25 GbE + 10 km of fibre or a 1 Gbit/s,
20 ms WAN. Used on the buffer <-> learner path only.
"""

from __future__ import annotations

import time


class LinkShaper:
    """One direction of one link. ``bandwidth_gbps`` / ``latency_ms`` of 0 disable that part."""

    def __init__(self, bandwidth_gbps: float = 0.0, latency_ms: float = 0.0):
        self.bytes_per_s = bandwidth_gbps * 1e9 / 8
        self.latency = latency_ms / 1e3
        self.free_at = 0.0
        self.bytes = 0

    @property
    def active(self) -> bool:
        return self.bytes_per_s > 0 or self.latency > 0

    def release_time(self, nbytes: int, now: float | None = None) -> float:
        """When a message of ``nbytes`` handed over at ``now`` arrives at the other end."""
        now = time.perf_counter() if now is None else now
        depart = max(now, self.free_at)
        self.free_at = depart + (nbytes / self.bytes_per_s if self.bytes_per_s else 0.0)
        self.bytes += nbytes
        return self.free_at + self.latency


def shaper_for(link_cfg) -> LinkShaper | None:
    """A shaper for a ``[comm.link]`` config, or None when the link is not shaped."""
    shaper = LinkShaper(link_cfg.bandwidth_gbps, link_cfg.latency_ms)
    return shaper if shaper.active else None
