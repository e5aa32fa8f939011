"""A network's parameters as one flat float32 vector and a view of it for each parameter: what the actors' numpy
copies of the learners' networks load a broadcast into (one ``np.copyto`` and every weight is current). No torch."""

from __future__ import annotations

import math

import numpy as np


def flat_views(shapes: list[tuple[int, ...]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """A zeroed float32 vector of every parameter in ``shapes``, in order, and a view of it shaped as each."""
    sizes = [math.prod(s) for s in shapes]
    flat = np.zeros(sum(sizes), np.float32)
    ends = np.cumsum(sizes)
    return flat, [flat[end - size:end].reshape(s) for s, size, end in zip(shapes, sizes, ends)]
