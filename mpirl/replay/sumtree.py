"""Vectorized binary sum tree (float64) for proportional prioritized sampling.

Layout: one flat float64 array ``tree`` of length ``2 * size`` where ``size`` is
``capacity`` rounded up to a power of two.  Node 1 is the root, node ``i`` has
children ``2i`` and ``2i + 1``, and leaf ``j`` (slot ``j``) lives at
``tree[size + j]``.  Element 0 is unused.  Leaves ``capacity .. size-1`` are
padding and stay 0 forever, so they are never sampled.

Every operation is vectorized over a batch of indices / draws; the only Python
loops run over the tree levels (``log2(size)``, e.g. 16 for 65,536 slots).
Parents are always *recomputed* as ``left + right`` (never patched with a
delta), so rounding errors do not accumulate over millions of updates.
"""
from __future__ import annotations

import numpy as np


def last_unique(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique values of ``idx`` and, for each, the position of its LAST
    occurrence in ``idx``.

    ``idx``: 1-D int array of length n.  Returns ``(uniq, pos)``, both int64
    arrays of length ``len(uniq)``, with ``idx[pos] == uniq``.  Used so that
    "last value wins" for duplicate indices is guaranteed (plain numpy fancy
    assignment does not promise an order).
    """
    idx = np.asarray(idx, dtype=np.int64)
    rev = idx[::-1]
    # return_index uses a stable sort, so it gives the first hit in `rev`,
    # i.e. the last occurrence in `idx`.
    uniq, first_in_rev = np.unique(rev, return_index=True)
    return uniq, (len(idx) - 1 - first_in_rev).astype(np.int64)


class SumTree:
    """Binary sum tree over ``capacity`` non-negative float64 leaves.

    Attributes:
        capacity: number of usable leaves (slots ``0 .. capacity-1``).
        size: ``capacity`` rounded up to a power of two (number of leaves).
        depth: number of levels below the root (``log2(size)``).
        tree: float64 array ``(2 * size,)``; see the module docstring.
    """

    def __init__(self, capacity: int) -> None:
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.size = 1 << (capacity - 1).bit_length()
        self.depth = self.size.bit_length() - 1
        self.tree = np.zeros(2 * self.size, dtype=np.float64)

    @property
    def total(self) -> float:
        """Sum of all leaves (the root), as a Python float."""
        return float(self.tree[1])

    def get(self, idx: np.ndarray) -> np.ndarray:
        """Leaf values for slots ``idx`` (int array, any shape) -> float64 array."""
        return self.tree[self.size + np.asarray(idx, dtype=np.int64)]

    def clear(self) -> None:
        """Set every leaf (and so every node) to 0."""
        self.tree.fill(0.0)

    def update(self, idx: np.ndarray, values: np.ndarray,
               assume_sorted_unique: bool = False) -> None:
        """Set leaves ``idx`` to ``values`` and recompute their ancestors.

        ``idx``: int array (n,), slots in ``[0, capacity)``.
        ``values``: float array (n,) (or a scalar), must be >= 0 and finite.
        Duplicate slots in ``idx``: the LAST value wins.
        ``assume_sorted_unique=True`` skips the de-duplication when the caller
        guarantees ``idx`` is strictly increasing (see :func:`last_unique`).
        Raises IndexError for out-of-range slots.
        """
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), idx.shape)
        if idx.size == 0:
            return
        if not assume_sorted_unique:
            idx, pos = last_unique(idx)
            values = values[pos]
        if idx[0] < 0 or idx[-1] >= self.capacity:
            raise IndexError(f"slot out of range [0, {self.capacity})")
        tree = self.tree
        nodes = idx + self.size
        tree[nodes] = values
        if nodes.size * self.depth >= self.size:
            self._rebuild()  # touching most of the tree anyway: one O(size) pass
            return
        for _ in range(self.depth):
            nodes = nodes >> 1
            # nodes stay sorted, so duplicates (siblings) are adjacent
            if nodes.size > 1:
                keep = np.empty(nodes.size, dtype=bool)
                keep[0] = True
                np.not_equal(nodes[1:], nodes[:-1], out=keep[1:])
                nodes = nodes[keep]
            left = nodes << 1
            tree[nodes] = tree[left] + tree[left + 1]

    def _rebuild(self) -> None:
        """Recompute every internal node from the leaves, level by level."""
        tree = self.tree
        lo = self.size >> 1
        while lo >= 1:
            hi = lo << 1
            np.add(tree[2 * lo:2 * hi:2], tree[2 * lo + 1:2 * hi:2], out=tree[lo:hi])
            lo >>= 1

    def find(self, u: np.ndarray) -> np.ndarray:
        """Prefix-sum search: for each ``u`` return the slot ``j`` with
        ``sum(leaves[:j]) <= u < sum(leaves[:j+1])``.

        ``u``: float array (k,), nominally in ``[0, total)``; values outside are
        clipped into ``[0, nextafter(total, 0)]``.  Returns int64 slots (k,).
        Requires ``total > 0`` (raises ValueError otherwise).

        Never returns a zero-valued leaf, even with rounding: the descent goes
        right only if ``u >= left`` AND the right subtree sum is ``> 0``;
        otherwise it goes left.  Starting from a positive root, every node
        visited is then positive (going left with ``u < left`` implies
        ``left > u >= 0``; going left because ``right == 0`` means
        ``left == node > 0``), so the leaf reached is positive.  Rounding can
        only shift a draw that lies within a few ulps of a boundary to a
        neighbouring positive leaf.
        """
        total = self.tree[1]
        if not total > 0.0:
            raise ValueError("find() on a sum tree with total <= 0")
        u = np.clip(np.asarray(u, dtype=np.float64), 0.0, np.nextafter(total, 0.0))
        tree = self.tree
        node = np.ones(u.shape, dtype=np.int64)
        for _ in range(self.depth):
            node <<= 1  # left child
            left = tree[node]
            right_pos = tree[node + 1] > 0.0
            go_right = (u >= left) & right_pos
            u -= np.where(go_right, left, 0.0)
            node += go_right
        return node - self.size
