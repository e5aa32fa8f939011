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


def check_target(flag: str, path: Path, force: bool, suffixes: tuple[str, ...] = (), forced: str = "--force") -> None:
    """Refuse an output file that cannot be written whole, before anything is computed for it: ConfigError naming
    ``flag`` and the fix for a name without one of ``suffixes``, a directory (``force`` replaces a file, never a
    directory), a parent that is missing, not a directory or not writable (tried by making a file there: ``access``
    says yes to root on a read-only mount or /proc), or a file that exists when ``force`` is False (``forced``: the
    option that would replace it, "" where nothing may be replaced)."""
    import tempfile

    from mpirl.domain import ConfigError
    path = Path(path)
    if suffixes and path.suffix.lower() not in suffixes:
        raise ConfigError(flag, f"{str(path)!r} is not a {' or '.join(suffixes)} file name; pass e.g. "
                                f"{flag} {path.with_suffix(suffixes[0]).name}")
    if path.is_dir():
        raise ConfigError(flag, f"{path} is a directory; pass a file name, e.g. {flag} "
                                f"{path / ('out' + (suffixes[0] if suffixes else ''))}")
    parent = path.parent
    if not parent.is_dir():
        what = "is a file, not a directory" if parent.exists() else "does not exist"
        raise ConfigError(flag, f"{parent} {what}; make the directory first, or pass a file in one that exists")
    if path.exists() and not force:
        fix = f"pass another file name, or {forced} to replace it" if forced else "pass a new file name (results are " \
                                                                                 "never overwritten)"
        raise ConfigError(flag, f"{path} exists; {fix}")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".mpirl-probe-")
    except OSError as err:
        raise ConfigError(flag, f"cannot write in {parent} ({err.strerror or err}); pass a file in a directory you "
                                "can write") from None
    os.close(fd)
    os.unlink(probe)
