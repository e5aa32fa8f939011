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

    Both operations touch the wide lower levels sparsely and treat the narrow
    upper levels (``DENSE`` nodes or fewer) as flat arrays, which costs numpy one
    call per level instead of several: ``update`` recomputes those levels whole,
    and ``find`` starts with a prefix sum over the widest of them and descends
    the tree only below it (4 levels instead of 16 for 65,536 slots).
    """

    DENSE = 4096  # a power of two

    def __init__(self, capacity: int) -> None:
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.size = 1 << (capacity - 1).bit_length()
        self.depth = self.size.bit_length() - 1
        self.tree = np.zeros(2 * self.size, dtype=np.float64)
        self._pairs = self.tree.reshape(-1, 2)  # _pairs[n] = children of node n
        assert self.DENSE & (self.DENSE - 1) == 0, "SumTree.DENSE must be a power of two"
        self._top = min(self.size, self.DENSE)  # nodes of the widest level handled as a flat array
        self._prefix = np.empty(self._top, dtype=np.float64)

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
        if not (np.isfinite(values).all() and (values >= 0).all()):
            raise ValueError("sum tree values must be finite and >= 0 (a priority from a diverged loss?)")
        if not assume_sorted_unique:
            idx, values = sorted_last(idx, values)
        if idx[0] < 0 or idx[-1] >= self.capacity:
            raise IndexError(f"slot out of range [0, {self.capacity})")
        tree = self.tree
        tree[idx + self.size] = values
        if idx.size * (self.depth - self._top.bit_length() + 1) >= self.size:
            self._rebuild(self.size >> 1)  # touching most of the tree anyway: one O(size) pass
            return
        nodes, level = (idx + self.size) >> 1, self.size >> 1  # parents, and the first node of their level
        while level >= self._top and level > 1:
            # Sorted nodes: a duplicate parent is recomputed twice from the same children, same value.
            tree[nodes] = self._pairs[nodes].sum(axis=1)
            nodes >>= 1
            level >>= 1
        self._rebuild(level)

    def _rebuild(self, level: int) -> None:
        """Recompute every node of the levels starting at node ``level`` and above from their children."""
        tree = self.tree
        lo = level
        while lo >= 1:
            hi = lo << 1
            np.add(tree[2 * lo:2 * hi:2], tree[2 * lo + 1:2 * hi:2], out=tree[lo:hi])
            lo >>= 1

    def find(self, u: np.ndarray) -> np.ndarray:
        """Prefix-sum search: for each ``u`` return the slot ``j`` with
        ``sum(leaves[:j]) <= u < sum(leaves[:j+1])``.

        ``u``: float array (k,), nominally in ``[0, total)``; values outside are
        clipped into ``[0, total)``.  Returns int64 slots (k,).
        Requires ``total > 0`` (raises ValueError otherwise).

        Never returns a zero-valued leaf, even with rounding. The first step is a
        binary search in the prefix sums ``c`` of the widest dense level: it picks
        the first node with ``c[j] > u``, and ``c[j] > c[j-1]`` means that node is
        positive. Below it the descent goes right only if ``u >= left`` AND the
        right subtree sum is ``> 0``, otherwise left; from a positive node every
        node visited is then positive (going left with ``u < left`` implies
        ``left > u >= 0``; going left because ``right == 0`` means ``left == node >
        0``), so the leaf reached is positive. Rounding can only shift a draw that
        lies within a few ulps of a boundary to a neighbouring positive leaf.
        """
        if not self.tree[1] > 0.0:
            raise ValueError("find() on a sum tree with total <= 0")
        tree, top = self.tree, self._top
        prefix = np.cumsum(tree[top:2 * top], out=self._prefix)
        u = np.clip(np.nan_to_num(np.asarray(u, dtype=np.float64), nan=0.0), 0.0, np.nextafter(prefix[-1], 0.0))
        j = np.searchsorted(prefix, u, side="right")
        u = u - np.where(j > 0, prefix[j - 1], 0.0)
        node = j + top
        for _ in range(self.depth - top.bit_length() + 1):
            node <<= 1  # left child
            left = tree[node]
            go_right = (u >= left) & (tree[node + 1] > 0.0)
            u -= np.where(go_right, left, 0.0)
            node += go_right
        return node - self.size


def sorted_last(idx: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``idx`` strictly increasing with, per slot, its LAST value (cheap when idx is already sorted).

    Sampled ids come back sorted (stratified draws, monotone search), so the fast
    path only drops adjacent repeats; anything else goes through :func:`last_unique`.
    """
    if idx.size > 1:
        step = idx[1:] - idx[:-1]
        if (step >= 0).all():
            if (step > 0).all():
                return idx, values
            keep = np.empty(idx.size, dtype=bool)
            keep[-1] = True
            np.not_equal(step, 0, out=keep[:-1])
            return idx[keep], values[keep]
        uniq, pos = last_unique(idx)
        return uniq, values[pos]
    return idx, values
