"""Optional payload compression for the long-haul link (zstd from the ``zstandard`` package).

A compressed message is ``int64`` raw size followed by the zstd frame. Senders
compress a packed message into a wire buffer; receivers decompress it back into
the message buffer, so the layouts and zero-copy views stay as they are. Only
point-to-point messages are compressed: a broadcast must have the same size on
every rank, so parameter broadcasts cross the link raw.
"""

from __future__ import annotations

import numpy as np

from mpirl.config import ConfigError

PREFIX = 8


def _zstandard():
    try:
        import zstandard
    except ImportError:
        raise ConfigError("comm.link.compression", "'zstd' needs the zstandard package, which is not installed: "
                          "pip install 'mpirl[zstd]' (or set compression = \"none\")") from None
    return zstandard


def check(link_cfg) -> None:
    """The package ``comm.link.compression`` needs is there (a job's checks, before any rank starts)."""
    if link_cfg.compression == "zstd":
        _zstandard()


class Codec:
    def __init__(self, level: int = 1):
        zstandard = _zstandard()
        self._c = zstandard.ZstdCompressor(level=level)
        self._d = zstandard.ZstdDecompressor()

    @staticmethod
    def bound(nbytes: int) -> int:
        """Wire buffer size that holds any compressed message of up to ``nbytes`` raw bytes."""
        return PREFIX + nbytes + nbytes // 128 + 1024  # zstd's worst case is ~ n / 128 over

    def compress_into(self, raw: np.ndarray, wire: np.ndarray) -> int:
        """Compress ``raw`` (uint8) into ``wire``; returns the wire size."""
        frame = self._c.compress(raw)
        wire[:PREFIX].view(np.int64)[0] = raw.nbytes
        wire[PREFIX:PREFIX + len(frame)] = np.frombuffer(frame, dtype=np.uint8)
        return PREFIX + len(frame)

    def decompress_into(self, wire: np.ndarray, raw: np.ndarray) -> int:
        """Decompress a wire message into ``raw``; returns the raw size."""
        n = int(wire[:PREFIX].view(np.int64)[0])
        data = self._d.decompress(wire[PREFIX:].tobytes() if not wire.flags.c_contiguous else wire[PREFIX:],
                                  max_output_size=n)
        raw[:n] = np.frombuffer(data, dtype=np.uint8)
        return n


def codec_for(link_cfg) -> Codec | None:
    return Codec(link_cfg.level) if link_cfg.compression == "zstd" else None
