"""Finished episodes on their way from a buffer to the learner: every one counted, the latest returns kept.

A buffer (or the learner's own intake, with ``topology.buffers = 0``) notes each finished episode as its actor's
message arrives; each reply to the first learner takes the tally: how many episodes finished since the last reply,
and the returns of the latest of them that the learner's return window counts (at most the ``slots`` a reply holds,
:func:`mpirl.comm.messages.episode_slots`). So the learner's episode count is the buffers' however short the
episodes, its window holds the buffers' latest returns as they finished (what ``run.target_return`` stops on), and
what waits between two replies is ``slots`` returns whatever the rate: nothing is queued without bound.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable


class EpisodeTally:
    """Episodes finished since the last :meth:`take`: their count and the latest counted returns."""

    def __init__(self, slots: int):
        self.count = 0
        self.latest: deque = deque(maxlen=slots)

    def add(self, returns: Iterable[float], counted: bool = True) -> None:
        """Episodes that finished, in order; ``counted``: whether their returns enter the learner's window
        (``run.return_from = "least_exploring"``: only that actor's do)."""
        returns = list(returns)
        self.count += len(returns)
        if counted:
            self.latest.extend(returns)

    def take(self) -> tuple[int, list[float]]:
        """``(episodes, returns)`` since the last take, the returns the latest counted ones, oldest first."""
        taken = self.count, list(self.latest)
        self.count = 0
        self.latest.clear()
        return taken
