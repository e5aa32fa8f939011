"""What an actor's games give the decisions after each step, with or without an inference worker between them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Outcome:
    """An actor's games after a step: arrays over its games, one per field of the algorithm's step spec (in a
    worker, views of the actor's message); ``fresh``: every game has just (re)started an episode, and only
    the observation fields mean something."""
    rows: dict
    fresh: bool
