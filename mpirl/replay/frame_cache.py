"""The learner's cache of frames a buffer already sent it (frames once, sampled replies), and the buffer's mirror of it.

A sampled reply carries each distinct frame of its batch once (:meth:`RingStore.gather_framed`). Random samples from a
large memory share few frames, so a reply carries about seven frames per experience, most of which the learner has
received before. With ``replay.frame_cache = C`` the learner keeps, per buffer, C frames it has received, and the
buffer sends only the others.

The buffer knows what the learner holds without asking: the cache is **direct-mapped**, a frame's place is a
function of its key. A frame is known by its buffer, its pool index ``i`` and the pool's generation of that index
(:attr:`FramePool.generation`, bumped whenever the index is handed out again, so a reused index is a different
frame). Its place is slot ``i mod C`` of its buffer's part of the cache. The buffer keeps a mirror of each slot's key
(:class:`CacheMirror`, 16 bytes a slot); building a reply it splits the batch's distinct frames into hits (the slot
holds the key: the stacks point into the cache) and misses (sent, and installed into their slot once the learner has
used the reply, unless another miss of the same reply claims that slot after them: the last one wins, on both sides).

Both sides change the cache in the same order: a buffer's replies reach the learner in the order it sent them
(one communicator and tag, non-overtaking), and the learner uses each before the next one
(:class:`FrameCache` installs a reply's misses when the next batch is joined). A run that resumes starts with an
empty cache on both sides.

On the learner the cache is one uint8 tensor on its device: ``buffers x C`` cached frames, then a scratch area for the
misses of the current batch. A batch's stacks are indices into the whole table, so the train step gathers them with
one ``index_select`` (:func:`mpirl.agents.tensors.to_tensors`), and only the misses cross to the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

def cache_slots(setting: int, capacity: int, framed: dict) -> int:
    """Frames the cache holds per buffer: ``replay.frame_cache``, at most what a full memory of ``capacity`` slots
    can reference (a frame pool of ``capacity x`` the stack depths: slots beyond it would never be used). Both the
    buffer and the learner compute it from the job's settings."""
    if not framed or not setting:
        return 0
    return int(min(setting, capacity * sum(depth for depth, _ in framed.values())))


class CacheMirror:
    """The buffer's copy of the keys its part of the learner's cache holds (pool index, generation per slot)."""

    def __init__(self, slots: int):
        self.slots = int(slots)
        self.index = np.full(self.slots, -1, dtype=np.int64)
        self.generation = np.zeros(self.slots, dtype=np.int64)

    def split(self, uniq: np.ndarray, generation: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The distinct pool frames ``uniq`` of a reply (their generations ``generation[uniq]``): where each sits in
        the learner's table as the reply tells it (``[0, C)``: its cache slot; ``C + j``: the reply's j-th sent
        frame), the pool indices to send, and per sent frame the slot it goes into afterwards (-1: none). The mirror
        is updated as the learner will update the cache."""
        uniq = np.asarray(uniq, dtype=np.int64)
        gens = generation[uniq]
        slot = uniq % self.slots
        hit = (self.index[slot] == uniq) & (self.generation[slot] == gens)
        miss = np.flatnonzero(~hit)
        place = slot.copy()
        place[miss] = self.slots + np.arange(len(miss))
        # Two misses of one reply for the same slot: the last one is installed (np.unique on the reversed slots
        # finds each slot's last miss).
        mslot = slot[miss]
        _, last = np.unique(mslot[::-1], return_index=True)
        keep = len(miss) - 1 - last
        install = np.full(len(miss), -1, dtype=np.int32)
        install[keep] = mslot[keep]
        self.index[mslot[keep]] = uniq[miss[keep]]
        self.generation[mslot[keep]] = gens[miss[keep]]
        return place.astype(np.int32), uniq[miss], install


def settle_slots(layout: Any, buf: np.ndarray, rows: int, sent: int) -> None:
    """A reply's ``frame_slots`` moved from where a reply with room for the most frames has them (where the buffer
    wrote them before it knew how many frames it sends) to where a reply of ``sent`` frames has them (a counted
    field follows the ones before it)."""
    most = layout.counted["frames"][2]
    written = layout.views(buf, rows, frames=most, frame_slots=most)["frame_slots"][:sent].copy()
    layout.views(buf, rows, frames=sent, frame_slots=sent)["frame_slots"][:] = written


class FrameCache:
    """The learner's side: per buffer ``slots`` frames on ``device``, then room for one batch's sent frames.

    :meth:`join` turns the buffers' replies of one batch into the batch's fields: the record fields concatenated,
    ``frames`` the whole table (a tensor) and each ``<name>_idx`` pointing into it. It counts per buffer the distinct
    frames that were cached (hits) and sent (misses)."""

    def __init__(self, buffers: int, slots: int, scratch: int, frame_shape: tuple, device: Any):
        import torch
        self.torch = torch
        self.buffers, self.slots = int(buffers), int(slots)
        self.cached = self.buffers * self.slots  # the scratch area starts here
        # Untouched until frames arrive (torch.empty: the pages are mapped as they are written; a slot is read only
        # after a frame was installed in it).
        self.table = torch.empty((self.cached + int(scratch), *frame_shape), dtype=torch.uint8, device=device)
        self.frame_nbytes = int(np.prod(frame_shape))
        self.hits = np.zeros(self.buffers, dtype=np.int64)
        self.misses = np.zeros(self.buffers, dtype=np.int64)
        self._install: tuple[Any, Any] | None = None  # (cache rows, scratch rows) of the last batch's sent frames

    def bytes_saved(self) -> np.ndarray:
        """Per buffer, the frame bytes the cache kept off the link so far."""
        return self.hits * self.frame_nbytes

    def join(self, views: list[dict], names: list[str]) -> dict[str, Any]:
        """One batch from every buffer's reply (their views in buffer order; ``names``: the batch's fields)."""
        torch, table = self.torch, self.table
        if self._install is not None:  # the last batch has been used: its sent frames go into their slots
            rows, src = self._install
            flat = table.flatten(1)
            flat.index_copy_(0, rows, flat.index_select(0, src))
            self._install = None
        out: dict[str, Any] = {name: np.concatenate([v[name] for v in views]) for name in names
                               if name != "frames" and not name.endswith("_idx") and name != "frame_slots"}
        rows, src, start = [], [], self.cached
        idx = {name: [] for name in names if name.endswith("_idx")}
        for b, v in enumerate(views):
            sent = v["frames"]
            n = len(sent)
            if n:
                table[start:start + n].copy_(torch.from_numpy(np.ascontiguousarray(sent)))
            cached = []
            for name in idx:
                local = v[name].astype(np.int64)
                idx[name].append(np.where(local < self.slots, local + b * self.slots, local - self.slots + start))
                cached.append(local[local < self.slots])
            self.hits[b] += len(np.unique(np.concatenate(cached))) if cached else 0
            self.misses[b] += n
            install = np.asarray(v["frame_slots"][:n], dtype=np.int64)
            keep = np.flatnonzero(install >= 0)
            rows.append(install[keep] + b * self.slots)
            src.append(keep + start)
            start += n
        for name, parts in idx.items():
            out[name] = np.concatenate(parts).astype(np.int64)
        out["frames"] = table
        rows_np, src_np = np.concatenate(rows), np.concatenate(src)
        if len(rows_np):
            self._install = (torch.as_tensor(rows_np, device=table.device), torch.as_tensor(src_np, device=table.device))
        return out
