"""A replay memory to a file and back: every record oldest first, with its priority.

Used by ``checkpoint.replay = true``: a buffer writes its memory when the job
stops (preempted or finished) and a resumed run starts from it instead of an
empty memory. Frame stacks stored once stay once (the frames and int32 indices
into them), so an Atari shard's file is about its memory's size, not 8x it.

The snapshot holds the records and their raw priorities, not the slots: a
restored memory has the same records in the same FIFO order with the same
sampling probabilities, and new slot versions (feedback in flight when the job
stopped is gone anyway).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mpirl.atomic import write_atomically

from .ring import RingStore
from .memory import ReplayMemory


def _prioritized(memory) -> bool:
    """A memory that keeps a priority per slot (a ReplayMemory: priorities or weights; not the relay's ring)."""
    return isinstance(memory, ReplayMemory)


def _ring(memory: ReplayMemory | RingStore) -> RingStore:
    return memory.store if isinstance(memory, ReplayMemory) else memory  # type: ignore[return-value]


def snapshot(memory: ReplayMemory | RingStore) -> dict[str, np.ndarray]:
    """The memory's records as arrays (oldest first); ``priority`` is the raw priority of each."""
    ring = _ring(memory)
    n = ring.size
    out = {name: np.empty((n, *shape), dtype) for name, (shape, dtype) in ring.spec.items()
           if name not in ring.framed}
    if ring.framed:
        for name, (depth, _) in ring.framed.items():
            out[f"{name}_idx"] = np.empty((n, depth), np.int32)
        frame_shape = next(iter(ring.framed.values()))[1]
        most = n * sum(depth for depth, _ in ring.framed.values())
        frames = np.empty((most, *frame_shape), np.uint8)  # untouched pages cost nothing
        _, used = ring.export_framed(out, frames)
        out["frames"] = frames[:used]
    else:
        ring.export(out)
    if _prioritized(memory):
        out["priority"] = memory.raw_priority[ring.oldest_first()]
    return out


def restore(memory: ReplayMemory | RingStore, arrays: dict[str, np.ndarray]) -> int:
    """Add a snapshot's records to ``memory`` (its spec and frame storage must match); returns how many."""
    arrays = dict(arrays)
    frames = arrays.pop("frames", None)
    ring = _ring(memory)
    if ring.framed and frames is None or not ring.framed and frames is not None:
        raise ValueError("the snapshot and the memory disagree on storing frames once (replay.dedup_frames)")
    n = len(arrays["priority"])
    if not n:
        return 0
    if _prioritized(memory):
        prio = arrays.pop("priority")
        return len(memory.add_framed(arrays, frames, prio) if frames is not None else memory.add(arrays, prio))
    return len(memory.add_framed(arrays, frames) if frames is not None else memory.add(arrays))


def save(path: Path, arrays: dict[str, np.ndarray], **meta: int) -> None:
    """Write ``arrays`` and integer ``meta`` to ``path`` (.npz) under a temporary name, then rename."""
    with write_atomically(path) as f:
        np.savez(f, **arrays, **{f"meta_{k}": np.int64(v) for k, v in meta.items()})


def load(path: Path) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """``(arrays, meta)`` as :func:`save` wrote them (no pickled objects are read)."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if not k.startswith("meta_")}
        meta = {k[5:]: int(z[k]) for k in z.files if k.startswith("meta_")}
    return arrays, meta
