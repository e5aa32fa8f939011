"""Binary sum tree (float64) for proportional prioritized sampling.

Layout: one flat float64 array ``tree`` of length ``2 * size`` where ``size`` is
``capacity`` rounded up to a power of two.  Node 1 is the root, node ``i`` has
children ``2i`` and ``2i + 1``, and leaf ``j`` (slot ``j``) lives at
``tree[size + j]``.  Element 0 is unused.  Leaves ``capacity .. size-1`` are
padding and stay 0 forever, so they are never sampled.

The two hot loops (updating a batch of leaves with their ancestors, and the
descent of a batch of draws) are compiled with numba: per item they are a few
dozen dependent loads, which numpy can only do one tree level per call (about
5 us a call at batch 512, 16 levels deep). Parents are always *recomputed* as
``left + right`` (never patched with a delta), so rounding errors do not
accumulate over millions of updates.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _update_sorted(tree, size, idx, values):  # pragma: no cover - compiled
    """Leaves ``idx`` (non-decreasing; a repeat: its last value wins) := ``values``,
    then their ancestors, level by level.

    The nodes of one level stay sorted, so a parent shared by neighbours is
    recomputed once: 512 leaves of 65,536 cost ~4,600 node sums, not 8,192.
    """
    n = idx.size
    nodes = np.empty(n, np.int64)
    for i in range(n):
        leaf = size + idx[i]
        tree[leaf] = values[i]
        nodes[i] = leaf >> 1
    m = n
    while m > 0 and nodes[0] >= 1:
        k, prev = 0, -1
        for i in range(m):
            node = nodes[i]
            if node == prev:
                continue
            prev = node
            tree[node] = tree[2 * node] + tree[2 * node + 1]
            parent = node >> 1
            if k == 0 or nodes[k - 1] != parent:
                nodes[k] = parent
                k += 1
        m = k


@njit(cache=True, nogil=True)
def _descend(tree, size, x, node):  # pragma: no cover - compiled
    """Every draw ``x[i]`` down to its leaf: ``node[i]`` := the leaf's node (``x`` is used up).

    Each draw is clipped into ``[0, hi]`` (NaN as 0) by the caller. The batch goes down level by level: the
    loads of one level are independent of each other, so their cache misses overlap, where one draw at a
    time would wait for each of its ~16 levels in turn (the tree is cold after a sample's frame copy). The
    step is branch-free; it decides as ``find`` documents (right only if ``x >= left`` and the right sum > 0).
    """
    b = x.size
    for i in range(b):
        node[i] = 1
    width = 1
    while width < size:
        for i in range(b):
            child = node[i] << 1  # left child
            left = tree[child]
            right = (x[i] >= left) & (tree[child + 1] > 0.0)
            x[i] = x[i] - left if right else x[i]
            node[i] = child + np.int64(right)
        width <<= 1


@njit(cache=True, nogil=True, inline="always")
def _clip(x, hi):  # pragma: no cover - compiled
    """``x`` clipped into ``[0, hi]``, NaN as 0."""
    if not x >= 0.0:
        return 0.0
    return hi if x > hi else x


@njit(cache=True, nogil=True)
def _find(tree, size, u, hi, out):  # pragma: no cover - compiled
    """For each draw ``u[i]`` (clipped into ``[0, hi]``, NaN as 0) the leaf whose prefix interval holds it."""
    x = np.empty(u.size, np.float64)
    for i in range(u.size):
        x[i] = _clip(u[i], hi)
    _descend(tree, size, x, out)
    for i in range(u.size):
        out[i] -= size


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

    ``update`` and ``find`` run compiled (see the module docstring); both take
    a whole batch per call.
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
        if not (np.isfinite(values).all() and (values >= 0).all()):
            raise ValueError("sum tree values must be finite and >= 0 (a priority from a diverged loss?)")
        if not assume_sorted_unique:
            idx, values = sorted_last(idx, values)
        if idx[0] < 0 or idx[-1] >= self.capacity:
            raise IndexError(f"slot out of range [0, {self.capacity})")
        _update_sorted(self.tree, self.size, idx, np.ascontiguousarray(values))

    def find(self, u: np.ndarray) -> np.ndarray:
        """Prefix-sum search: for each ``u`` return the slot ``j`` with
        ``sum(leaves[:j]) <= u < sum(leaves[:j+1])``.

        ``u``: float array (k,), nominally in ``[0, total)``; values outside are
        clipped into ``[0, total)``.  Returns int64 slots (k,).
        Requires ``total > 0`` (raises ValueError otherwise).

        Never returns a zero-valued leaf, even with rounding. The descent from
        the root goes right only if ``u >= left`` AND the right subtree sum is
        ``> 0``, otherwise left; from a positive node every node visited is then
        positive (going left with ``u < left`` implies ``left > u >= 0``; going
        left because ``right == 0`` means ``left == node > 0``), so the leaf
        reached is positive. Rounding can only shift a draw that lies within a
        few ulps of a boundary to a neighbouring positive leaf.
        """
        total = self.tree[1]
        if not total > 0.0:
            raise ValueError("find() on a sum tree with total <= 0")
        u = np.ascontiguousarray(u, dtype=np.float64).reshape(-1)
        out = np.empty(u.size, dtype=np.int64)
        _find(self.tree, self.size, u, np.nextafter(total, 0.0), out)
        return out


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
