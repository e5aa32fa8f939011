"""Compiled kernels that are compiled (or loaded from numba's cache) when first called, not when imported.

``import numba`` costs a process 0.4-0.5 CPU-s here (py-spy of a CartPole job's actors: half a second each, for a
module they imported and never called). The replay's modules are imported by every rank of the actor -> buffer ->
learner family, and most of their kernels run on the buffers and the learner alone: :func:`kernel` is
``numba.njit(cache=True, nogil=True)`` applied at the first call, so a rank that never calls a kernel never imports
numba. The compiled function, its cache on disk and its speed are the same; a call pays one Python call more.
A kernel so made is for Python callers: another compiled kernel cannot call it (none does).
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def kernel(fn: F) -> F:
    """``fn`` compiled in nopython mode, with numba's on-disk cache and the GIL released, at its first call."""
    compiled: list = []

    @functools.wraps(fn)
    def call(*args):
        if not compiled:
            from numba import njit
            compiled.append(njit(cache=True, nogil=True)(fn))
        return compiled[0](*args)
    call.py_func = fn  # type: ignore[attr-defined]  # as numba's dispatchers name the Python function
    return call  # type: ignore[return-value]
