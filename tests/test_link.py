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


def test_codec_round_trip_into_preallocated_buffers():
    import numpy as np
    from mpirl.comm.codec import Codec
    codec = Codec(level=1)
    frames = np.zeros(2 * 4 * 84 * 84, np.uint8)
    frames[::97] = 200  # mostly black frames compress well
    wire = np.zeros(Codec.bound(frames.nbytes), np.uint8)
    n = codec.compress_into(frames, wire)
    assert n < frames.nbytes / 10
    out = np.zeros(frames.nbytes + 100, np.uint8)
    assert codec.decompress_into(wire[:n], out) == frames.nbytes
    np.testing.assert_array_equal(out[:frames.nbytes], frames)
    noise = np.random.default_rng(0).integers(0, 256, 100_000).astype(np.uint8)  # incompressible still fits
    assert codec.compress_into(noise, np.zeros(Codec.bound(noise.nbytes), np.uint8)) <= Codec.bound(noise.nbytes)
