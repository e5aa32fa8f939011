"""The learner loop's bookkeeping (:mod:`mpirl.actor_learner.learner`): its counters, which its checkpoint saves
and restores, and its clock of compute against communication. The loop owns both; it hands them to its batch
source and its algorithm, which add to them."""

from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator


@dataclass
class Counters:
    """The learner loop's counters, saved in and restored from its checkpoint by the loop itself."""

    n_buffers: int
    return_window: int
    version: int = 0  # parameter versions published
    episodes: int = 0
    skipped: int = 0  # batches skipped for a non-finite loss or gradient
    skipped_in_a_row: int = 0
    returns: deque = field(init=False)
    env_steps: list = field(init=False)  # per buffer
    consumed: list = field(init=False)  # samples trained on, per buffer

    def __post_init__(self):
        self.returns = deque(maxlen=self.return_window)
        self.env_steps = [0] * self.n_buffers
        self.consumed = [0] * self.n_buffers

    def state(self) -> dict:
        return {"version": self.version, "episodes": self.episodes, "returns": list(self.returns),
                "env_steps": list(self.env_steps), "consumed": list(self.consumed), "skipped": self.skipped}

    def restore(self, st: dict) -> None:
        self.version, self.episodes = int(st["version"]), int(st["episodes"])
        self.returns.extend(st["returns"])
        self.env_steps, self.consumed = list(st["env_steps"]), list(st["consumed"])
        self.skipped = int(st["skipped"])


class Clock:
    """Seconds spent computing vs communicating (sending, receiving, waiting for messages)."""

    def __init__(self) -> None:
        self.compute = self.comm = 0.0

    @contextmanager
    def computing(self) -> Iterator[None]:
        t = time.perf_counter()
        yield
        self.compute += time.perf_counter() - t

    @contextmanager
    def communicating(self) -> Iterator[None]:
        t = time.perf_counter()
        yield
        self.comm += time.perf_counter() - t
