"""What an actor's games give the decisions after each step, with or without an inference worker between them."""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass
class Outcome:
    """An actor's games after a step: arrays over its games, one per field of the algorithm's step spec (in a
    worker, views of the actor's message); ``fresh``: every game has just (re)started an episode, and only
    the observation fields mean something."""
    rows: dict
    fresh: bool


MAX_FAILING = 10  # failures of an actor's games in a row, without a good step between, before it gives up


def count_failure(games, err: Exception) -> None:
    """A game of ``games`` (with ``env_errors``, ``failing``, ``label`` and ``cfg``) raised: say so and count it;
    after ``MAX_FAILING`` failures in a row without one good step, raise (the actor cannot make progress, and the
    job ends naming it). The caller then rebuilds its games."""
    games.env_errors += 1
    games.failing += 1
    print(f"mpirl: {games.label}: {games.cfg.env.id} raised {type(err).__name__}: {err}; "
          f"rebuilding its environments (failure {games.env_errors})", file=sys.stderr, flush=True)
    if games.failing >= MAX_FAILING:
        raise RuntimeError(f"{games.cfg.env.id} failed {games.failing} times in a row on {games.label}; "
                           "giving up") from err
