"""The importance-sampling weights a learner computes from the probabilities its batch was drawn with (Schaul et al.
2016, section 3.4), and beta's linear schedule towards 1.

In numpy, not a compiled kernel: a learner of the proposed placement calls nothing else of the replay's, and
``import numba`` (with loading the kernel from numba's cache) cost each such learner 0.3-0.5 CPU-s a process for
a batch of a few hundred numbers (numpy over 512 of them: 8 us a call here, the kernel 10 us with its call).
"""

from __future__ import annotations

import math

import numpy as np


def importance_weights(probs: np.ndarray, n: int, beta: float, smallest: float | None = None) -> np.ndarray:
    """Importance-sampling weights ``w_i = (n * P(i)) ** -beta / max_j w_j``.

    ``probs``: float (k,) sampling probabilities of the batch items over the
    WHOLE replay.  With several shards, pass each item's in-shard prob
    multiplied by that shard's share of the batch (k_shard / k), and ``n`` = the
    total number of records over all shards.  (After max-normalization the
    factor n cancels; it is kept so the formula reads as in the paper.)
    Returns float32 (k,), max == 1; ``beta = 0`` gives all ones. ``smallest``: the smallest probability of a batch
    these ``probs`` are a part of (K data-parallel learners' parts): the weights are normalised by the whole
    batch's largest, so each part's are those of the whole batch. A NaN probability makes every weight NaN (as
    numpy's max does); a zero one with ``beta > 0`` an infinite weight, and NaN weights once divided.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if n < 1:
        raise ValueError("n must be >= 1")
    if probs.size == 0:
        return np.zeros(0, dtype=np.float32)
    power, whole = np.float64(-float(beta)), np.float64(n)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        w = (whole * probs) ** power
        top = w.max() if smallest is None or math.isnan(smallest) else (whole * np.float64(smallest)) ** power
        return (w / top).astype(np.float32)


def linear_schedule(start: float, end: float, t: float, duration: float) -> float:
    """Linear interpolation from ``start`` (t <= 0) to ``end`` (t >= duration).

    Used to anneal beta towards 1.  ``duration <= 0`` returns ``end``.
    """
    if duration <= 0:
        return float(end)
    frac = min(max(t / duration, 0.0), 1.0)
    return float(start + frac * (end - start))
