"""Waiting without burning a core: poll, then sleep a little longer each time.

Jobs are often oversubscribed (more ranks than cores); a rank spinning in a
blocking receive starves the ranks that have work. Every wait in mpirl polls
with ``Test`` and sleeps through a :class:`Backoff` in between.
"""

from __future__ import annotations

import os
import time

# Give the core to another runnable process, if any (a plain return on an idle core).
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


class Backoff:
    """Yield ``spins`` times, then sleep ``first`` seconds, doubling up to ``longest``; ``reset()`` after progress.

    The yields (``sched_yield``) keep a rank that just made progress responsive to the
    next message without holding a core: an idle core gives the time straight back, a
    busy one runs another rank. Only a rank that stays idle goes on to real sleeps.
    """

    def __init__(self, first: float = 20e-6, longest: float = 1e-3, spins: int = 50):
        self.first, self.longest, self.spins = first, longest, spins
        self.delay = first
        self.left = spins

    def reset(self) -> None:
        self.delay = self.first
        self.left = self.spins

    def sleep(self) -> None:
        if self.left > 0:
            self.left -= 1
            _yield()
            return
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, self.longest)


def wait_until(done, timer=None, first: float = 20e-6, longest: float = 1e-3) -> None:
    """Call ``done()`` until it returns True, sleeping with back-off in between.

    ``timer`` (any object with ``add(seconds)``) is told the time spent waiting.
    """
    if done():
        return
    backoff = Backoff(first, longest)
    start = time.perf_counter()
    while not done():
        backoff.sleep()
    if timer is not None:
        timer.add(time.perf_counter() - start)
