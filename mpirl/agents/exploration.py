"""Ape-X's exploration: each actor's epsilon by its index among the job's actors, and epsilon-greedy over a batch of
greedy actions. numpy only: an actor on vector observations acts without torch (:mod:`mpirl.agents.acting`)."""

from __future__ import annotations

import numpy as np


def apex_epsilon(index: int, actors: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X exploration of actor ``index`` of ``actors``: base ** (1 + alpha * i / (N - 1))."""
    if actors <= 1:
        return base
    return base ** (1.0 + alpha * index / (actors - 1))


def env_epsilons(actor_index: int, actors: int, envs_per_actor: int, base: float = 0.4,
                 alpha: float = 7.0) -> np.ndarray:
    """Ape-X epsilons for the ``envs_per_actor`` games of one actor.

    Ape-X gives each of its N single-game actors its own epsilon; with k games per
    actor rank every game plays that role: game j of actor i is Ape-X actor i*k + j
    of N*k, so the whole spread from ``base`` down to ``base ** (1 + alpha)`` is used.
    """
    k = envs_per_actor
    return np.array([apex_epsilon(actor_index * k + j, actors * k, base, alpha) for j in range(k)])


def explore(greedy: np.ndarray, epsilon, rng: np.random.Generator, n_actions: int) -> np.ndarray:
    """Epsilon-greedy over ``greedy`` actions: each row with probability ``epsilon`` (one, or one per row)
    takes a uniformly random action instead."""
    take = rng.random(len(greedy)) < epsilon
    return np.where(take, rng.integers(n_actions, size=len(greedy)), greedy)
