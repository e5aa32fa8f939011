"""The emulated long-haul link: arrival times from bandwidth, latency and a busy link."""

import pytest

from mpirl.comm.link import LinkShaper, shaper_for
from mpirl.config import LinkConfig


def test_latency_and_serialization():
    link = LinkShaper(bandwidth_gbps=8.0, latency_ms=10.0)  # 1 GB/s
    assert link.release_time(1_000_000, now=0.0) == pytest.approx(0.001 + 0.010)
    # handed over at once: queues behind the first on the wire, same latency after
    assert link.release_time(1_000_000, now=0.0) == pytest.approx(0.002 + 0.010)
    # later, on an idle link: no queueing
    assert link.release_time(1_000, now=1.0) == pytest.approx(1.0 + 1e-6 + 0.010)
    assert link.bytes == 2_001_000


def test_paper_link_and_off_switch():
    fibre = LinkShaper(bandwidth_gbps=25, latency_ms=0.05)  # 25 GbE + 10 km of fibre (~5 us/km)
    batch = 512 * 56_000  # the paper's Atari batch as uint8 frames
    assert fibre.release_time(batch, now=0.0) == pytest.approx(batch / 25e9 * 8 + 50e-6)
    assert shaper_for(LinkConfig()) is None
    assert shaper_for(LinkConfig(latency_ms=1)).active
