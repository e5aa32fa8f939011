"""Waiting without burning a core: poll, then sleep a little longer each time.

Jobs are often oversubscribed (more ranks than cores); a rank spinning in a
blocking receive starves the ranks that have work. Every wait in mpirl polls
with ``Test`` and sleeps through a :class:`Backoff` in between.
"""

from __future__ import annotations

import time


class Backoff:
    """Sleep ``first`` seconds, doubling up to ``longest``; ``reset()`` after progress."""

    def __init__(self, first: float = 20e-6, longest: float = 1e-3):
        self.first, self.longest = first, longest
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    def sleep(self) -> None:
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
