"""Slower environments on purpose: the survey's straggler, a worker whose steps take longer."""

from __future__ import annotations

import time


class Delay:
    """``seconds`` added to every env step, slept in pieces of at least a millisecond (a sleep of a few
    microseconds lasts tens), the oversleep counted against the next piece."""

    def __init__(self, seconds: float):
        self.seconds, self.owed = float(seconds), 0.0

    def step(self) -> None:
        self.owed += self.seconds
        if self.owed >= 1e-3:
            start = time.perf_counter()
            time.sleep(self.owed)
            self.owed -= time.perf_counter() - start
