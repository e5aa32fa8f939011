"""What a single-agent environment's actions are, as a policy samples them (:class:`ActionSpec`), and how a sampled
action reaches the environment (:meth:`ActionSpec.to_env`).

Three kinds of Gymnasium action space are taken:

* ``Discrete(n)`` -- one integer; stored as a scalar int64 (what every discrete job has always recorded);
* ``MultiDiscrete(nvec)`` -- one integer per dimension, stored int64 of the space's shape;
* ``Box`` -- float32 actions of the space's shape. A policy samples them unbounded (a Gaussian); the environment
  gets them clipped to the space's bounds while the recorded action (and its log-probability) is the unclipped
  sample (CleanRL's and SB3's convention). An unbounded ``Box`` (``low = -inf``) is passed on as sampled.

Any other space (Dict, Tuple, MultiBinary, Text, Graph ... actions) is refused with a :class:`ConfigError` naming
``env.id``. Discrete spaces with a ``start`` other than 0 are shifted: the policy samples from 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from mpirl.domain import ConfigError

KINDS = ("discrete", "multidiscrete", "box")


@dataclass(frozen=True)
class ActionSpec:
    """A policy's view of an action space: ``kind`` (one of :data:`KINDS`), the stored ``shape`` and ``dtype`` of one
    action, ``nvec`` (the choices per dimension; discrete kinds), ``low``/``high`` (float64 arrays of ``shape``;
    ``box``) and ``start`` (the offset of each discrete dimension)."""

    kind: str
    shape: tuple
    nvec: tuple = ()
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    start: tuple = ()

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32) if self.kind == "box" else np.dtype(np.int64)

    @property
    def continuous(self) -> bool:
        return self.kind == "box"

    @property
    def size(self) -> int:
        """Numbers in one action: 1 for Discrete, the dimensions otherwise."""
        return int(math.prod(self.shape))

    @property
    def n_outputs(self) -> int:
        """Outputs of a policy head: logits of every choice of every dimension, or a Gaussian's means."""
        return self.size if self.continuous else int(sum(self.nvec))

    @property
    def bounded(self) -> bool:
        return self.continuous and bool(np.isfinite(self.low).any() or np.isfinite(self.high).any())

    def describe(self) -> str:
        if self.kind == "discrete":
            return f"{self.nvec[0]} actions"
        if self.kind == "multidiscrete":
            return f"{len(self.nvec)} discrete dimensions of {'/'.join(map(str, self.nvec))} actions"
        lo, hi = float(np.min(self.low)), float(np.max(self.high))
        return f"continuous actions {self.shape} in [{lo:g}, {hi:g}]"

    def to_env(self, action: np.ndarray):
        """One sampled action as its environment takes it: an int, an int array shifted by the space's start, or
        floats clipped to the bounds (an unbounded side as it is)."""
        if self.kind == "discrete":
            return int(action) + (self.start[0] if self.start else 0)
        if self.kind == "multidiscrete":
            a = np.asarray(action, np.int64).reshape(self.shape)
            return a + np.asarray(self.start, np.int64).reshape(self.shape) if self.start else a
        return np.clip(np.asarray(action, np.float32).reshape(self.shape), self.low, self.high).astype(np.float32)

    def __eq__(self, other) -> bool:  # the arrays compare by value
        return (isinstance(other, ActionSpec) and (self.kind, self.shape, self.nvec, self.start)
                == (other.kind, other.shape, other.nvec, other.start)
                and all(np.array_equal(a, b) for a, b in ((self.low, other.low), (self.high, other.high))
                        if a is not None or b is not None))

    __hash__ = None  # type: ignore[assignment]


def discrete(n: int) -> ActionSpec:
    return ActionSpec("discrete", (), (int(n),))


def as_spec(action: ActionSpec | int) -> ActionSpec:
    """An :class:`ActionSpec`, or a number of discrete actions as one."""
    return action if isinstance(action, ActionSpec) else discrete(int(action))


def action_spec(space: gym.Space, env_id: str) -> ActionSpec:
    """The :class:`ActionSpec` of ``space``, or a ConfigError naming ``env.id`` for a space no policy here takes."""
    if isinstance(space, gym.spaces.Discrete):
        start = int(space.start)
        return ActionSpec("discrete", (), (int(space.n),), start=(start,) if start else ())
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = tuple(int(n) for n in np.asarray(space.nvec).reshape(-1))
        start = tuple(int(s) for s in np.asarray(space.start).reshape(-1))
        return ActionSpec("multidiscrete", tuple(space.shape), nvec, start=start if any(start) else ())
    if isinstance(space, gym.spaces.Box):
        if not np.issubdtype(space.dtype, np.floating):
            raise ConfigError("env.id", f"{env_id!r} has action space {space}, a Box of {space.dtype}: no policy "
                                        "here samples integer boxes; wrap the environment so its actions are "
                                        "Discrete, MultiDiscrete or a float Box")
        if not space.shape or math.prod(space.shape) == 0:
            raise ConfigError("env.id", f"{env_id!r} has action space {space} with no dimensions; choose an "
                                        "environment whose actions have at least one")
        low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
        return ActionSpec("box", tuple(space.shape), low=low, high=high)
    raise ConfigError("env.id", f"{env_id!r} has action space {space}: the policies here take Discrete, "
                                "MultiDiscrete and Box actions; wrap the environment so its actions are one of "
                                "those, or choose another environment")
