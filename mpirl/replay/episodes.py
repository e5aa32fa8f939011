"""Whole-episode storage for multi-agent learners (QMIX): one versioned slot per episode.

An *episode spec* is a record spec (see ``ring.py``) whose every field starts with
the time axis ``T + 1``, e.g. predator-prey with n agents::

    {"obs": ((T + 1, n, 5, 5, 3), np.uint8), "state": ((T + 1, 10, 10, 3), np.uint8),
     "avail": ((T + 1, n, 6), np.bool_), "actions": ((T + 1, n), np.int64),
     "reward": ((T + 1,), np.float32), "terminated": ((T + 1,), np.bool_),
     "filled": ((T + 1,), np.bool_)}

The time convention is pymarl's ``EpisodeBatch``: an episode of ``L`` steps has
``filled[t]`` True for its L transitions ``t < L`` (a prefix), row ``L`` holds the
observation, state and available actions after the last step (what the target
network bootstraps from; ``filled[L]`` is False), and rows ``L + 1 .. T`` are
padding. ``L = filled.sum()`` is the slot's length (:attr:`EpisodeStore.lengths`).

An :class:`EpisodeStore` is a :class:`~mpirl.replay.ring.RingStore` of episodes:
FIFO over ``capacity`` slots, a version per slot (the global insertion number, so a
sampled ``(slot, version)`` pair tells whether the slot was refilled since), and
all ``T + 1`` rows of every field copied on insertion. :meth:`EpisodeStore.add`
guarantees the padding: after the copy, rows ``L + 1 ..`` of the written slots are
zero (False), whatever the sender put there and whatever longer episode the slot
held before, so a learner can mask with ``filled`` and never sees stale data.

Which slots a learner trains on is a sampler's business (``samplers.py``): the
sampler knows slot ids, versions and weights; the store knows the data.
:meth:`EpisodeStore.gather_picks` joins the two.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .ring import RingStore, Spec

FILLED = "filled"


class EpisodeStore(RingStore):
    """Fixed-capacity FIFO of whole episodes (``T + 1`` rows per field per slot): a RingStore whose
    :meth:`add` keeps each slot's length and zeroes the padding.

    Args:
        spec: episode spec ``{name: ((T + 1, *shape), dtype)}``; every field shares the
            leading ``T + 1`` and ``filled`` is ``((T + 1,), bool)``.
        capacity: number of episode slots.

    Attributes:
        fields: ``{name: array (capacity, T + 1, *shape)}`` (see RingStore for ``versions``, ``size``, ...).
        rows: ``T + 1``, the time rows per episode.
        lengths: int64 ``(capacity,)``, steps ``L`` of each slot's episode (0 = empty).
    """

    def __init__(self, spec: Spec, capacity: int) -> None:
        spec = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in spec.items()}
        if FILLED not in spec:
            raise ValueError(f"an episode spec needs a {FILLED!r} field ((T + 1,), bool)")
        rows = spec[FILLED][0][:1]
        if spec[FILLED] != (rows, np.dtype(np.bool_)) or not rows or rows[0] < 1:
            raise ValueError(f"field {FILLED!r} must be ((T + 1,), bool), got {spec[FILLED]}")
        for name, (shape, _) in spec.items():
            if shape[:1] != rows:
                raise ValueError(f"field {name!r}: shape {shape} does not start with the time axis {rows[0]}")
        super().__init__(spec, capacity)
        self.rows = rows[0]
        self.lengths = np.zeros(self.capacity, dtype=np.int64)
        self._steps = np.arange(self.rows)

    @property
    def nbytes(self) -> int:
        """Bytes held: every field's rows, the slot versions and lengths."""
        return super().nbytes + self.lengths.nbytes

    # -- writing -------------------------------------------------------------
    def add(self, episodes: Mapping[str, np.ndarray]) -> np.ndarray:
        """Append k episodes ``{name: array (k, T + 1, *shape)}``; returns the int64 slot ids.

        ``filled`` must be a prefix mask per episode (True for ``t < L``). Same contract
        as :meth:`RingStore.add` when k > capacity: the kept episodes are the last
        ``len(ids)``. Rows ``L + 1 ..`` of each written slot are zeroed after the copy.
        Pass ``store.versions[ids]`` to the sampler's ``on_insert``.
        """
        k = self.count_rows(episodes)
        filled = np.asarray(episodes[FILLED], dtype=np.bool_)
        lengths = filled.sum(axis=1)
        if not np.array_equal(filled, self._steps < lengths[:, None]):
            raise ValueError(f"{FILLED!r} must be True for the first L rows of an episode and False after")
        ids = super().add(episodes)
        lengths = lengths[k - len(ids):]
        self.lengths[ids] = lengths
        for slot, steps in zip(ids.tolist(), lengths.tolist()):
            if steps + 1 < self.rows:  # row L is the final observation; L + 1 .. T are padding
                for field in self.fields.values():
                    field[slot, steps + 1:] = 0
        return ids

    def clear(self) -> None:
        """Forget every episode (versions keep counting; see RingStore.clear)."""
        super().clear()
        self.lengths.fill(0)

    # -- reading -------------------------------------------------------------
    def gather_picks(self, picks, out: Mapping[str, np.ndarray]) -> None:
        """Fill a learner's batch arrays from a sampler's ``Picks`` (``samplers.py``).

        The first ``picks.reuse`` rows of ``out`` are the cached reuse block: gathered only
        when ``picks.fresh`` (a new reuse set), otherwise left as they are (so the caller
        must not write into them between steps). Rows ``reuse .. b-1`` are gathered every
        call. With ``reuse == 0`` (uniform sampling) this is a plain :meth:`gather`.
        """
        r = picks.reuse
        if r and picks.fresh:
            self.gather(picks.ids[:r], out)
        if len(picks.ids) > r:
            self.gather(picks.ids[r:], {name: a[r:] for name, a in out.items()})

    def batch_arrays(self, b: int) -> dict[str, np.ndarray]:
        """Zeroed arrays ``{name: (b, T + 1, *shape)}`` to gather batches of b episodes into
        (allocate once; gathering into fresh arrays page-faults)."""
        return {name: np.zeros((b, *shape), dtype) for name, (shape, dtype) in self.spec.items()}

    # -- checkpoints ---------------------------------------------------------
    def snapshot(self) -> dict[str, np.ndarray]:
        """Every episode as arrays ``{name: (size, T + 1, *shape)}``, oldest first
        (for ``checkpoint.replay``: write with ``snapshot.save``)."""
        out = {name: np.empty((self.size, *shape), dtype) for name, (shape, dtype) in self.spec.items()}
        self.export(out)
        return out

    def restore(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """Add a :meth:`snapshot`'s episodes (same spec); returns their new slot ids.

        Like ``snapshot.restore``: the same episodes in the same FIFO order, new versions
        and lengths recomputed from ``filled``; tell the sampler with ``on_insert``.
        """
        extra = arrays.keys() - self.spec.keys()
        if extra:
            raise ValueError(f"the snapshot has fields the episode spec lacks: {sorted(extra)}")
        if not len(arrays[FILLED]):
            return np.zeros(0, dtype=np.int64)
        return self.add(arrays)
