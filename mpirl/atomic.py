"""Files that are either whole or absent: write under a temporary name, sync, rename.

Checkpoints and replay snapshots use it, so a crash mid-write leaves a ``*.tmp``
file that nothing takes for the real one, never a truncated file under the real name.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator


@contextmanager
def write_atomically(path: Path) -> Iterator[BinaryIO]:
    """``with write_atomically(p) as f: f.write(...)``: ``p`` appears, complete, when the block ends."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        yield f
    commit(tmp, path)


def commit(tmp: Path, path: Path) -> None:
    """Sync the closed file ``tmp`` and rename it to ``path`` (for writers that need a file name, such as HDF5)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(Path(path).parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
