"""Image observations from Gymnasium envs: which axis holds the channels, and frames kept compact.

Gymnasium's convention for images is channels last, ``(H, W, C)`` (an RGB frame, MinAtar's
``(10, 10, C)`` boolean planes); torch's convolutions take channels first, ``(C, H, W)``, the
layout of a frame stack (ale-py's ``(4, 84, 84)``). An env's 3-D observation is read as
channels last when its last axis is no longer than the other two (ties too: Seaquest's
``(10, 10, 10)``), else as channels first; ``env.channels`` says it outright. Frames are moved
to channels first once, as the actor steps the env, so replay, messages and networks all see
``(C, H, W)``. Boolean frames stay ``bool`` (one byte a cell, 0 or 1): the network reads them
as they are, where it scales ``uint8`` pixels by 1/255.
"""

from __future__ import annotations

import numpy as np

def channels_last(shape: tuple[int, ...], setting: str = "auto") -> bool:
    """Whether observations of ``shape`` are to be moved from ``(H, W, C)`` to ``(C, H, W)``."""
    if len(shape) != 3 or setting == "first":
        return False
    if setting == "last":
        return True
    return shape[2] <= min(shape[0], shape[1])


def channels_first_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``(H, W, C)`` -> ``(C, H, W)``."""
    return (shape[2], shape[0], shape[1])


def to_channels_first(batch: np.ndarray) -> np.ndarray:
    """A batch ``(k, H, W, C)`` as ``(k, C, H, W)``, contiguous (what replay and the wire copy)."""
    return np.ascontiguousarray(np.moveaxis(batch, -1, 1))
