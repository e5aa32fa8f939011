"""An actor's local n-step buffer for one environment (Ape-X actor side).

Turns single steps ``(s_t, a_t, r_t, s_{t+1})`` into n-step transitions
``(s_t, a_t, R_t, s_{t+m}, done, discount)`` with
``R_t = sum_{k<m} gamma^k r_{t+k}`` and ``discount = gamma^m`` where m is the
number of rewards summed (m = n except at the end of an episode).  The learner's
target is then ``R_t + discount * (1 - done) * max_a Q(s_{t+m}, a)``.
"""
from __future__ import annotations

from collections import deque
from typing import Any

Transition = tuple[Any, Any, float, Any, bool, float]
"""``(obs, action, n_step_return, next_obs, done, discount)``."""


class NStepAccumulator:
    """Sliding window of the last < n steps of the current episode.

    Observations are stored by reference, never copied: pass arrays that are
    not modified in place afterwards (Gymnasium returns a fresh array per
    step; copy first if your environment reuses its observation buffer).
    The emitted ``obs`` / ``next_obs`` are those same objects.
    """

    def __init__(self, n: int, gamma: float) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n = int(n)
        self.gamma = float(gamma)
        self._steps: deque[tuple[Any, Any, float]] = deque()  # (obs, action, reward)

    def __len__(self) -> int:
        """Number of pending steps (not yet emitted)."""
        return len(self._steps)

    def oldest_obs(self) -> Any:
        """The observation of the oldest pending step (the window must not be empty)."""
        return self._steps[0][0]

    def clear(self) -> None:
        """Drop pending steps (e.g. when an episode is abandoned)."""
        self._steps.clear()

    def push(self, obs: Any, action: Any, reward: float, next_obs: Any,
             terminated: bool, truncated: bool) -> list[Transition]:
        """Record one step; return the transitions that became complete.

        * Window full (n steps), episode goes on: emit the oldest step with
          ``R = sum_{k<n} gamma^k r_k``, ``next_obs`` = this step's next_obs
          (the obs n steps after it), ``done=False``, ``discount=gamma^n``.
        * ``terminated``: emit every pending step with ``done=True`` (no
          bootstrap); discount is still ``gamma^m`` for its m rewards.
        * ``truncated`` (time limit, not terminal): emit every pending step
          with ``done=False``, ``next_obs`` = the final obs, ``discount=gamma^m``.
          ``terminated`` wins if both are set.
        After either, the accumulator is empty for the next episode.
        """
        steps = self._steps
        steps.append((obs, action, float(reward)))
        if terminated or truncated:
            out = self._flush(next_obs, bool(terminated))
            steps.clear()
            return out
        if len(steps) < self.n:
            return []
        ret = 0.0
        for _, _, r in reversed(steps):
            ret = r + self.gamma * ret
        first_obs, first_action, _ = steps.popleft()
        return [(first_obs, first_action, ret, next_obs, False, self.gamma ** self.n)]

    def _flush(self, next_obs: Any, done: bool) -> list[Transition]:
        """All pending steps, oldest first, bootstrapping from ``next_obs``."""
        out: list[Transition] = []
        ret = 0.0
        for m, (o, a, r) in enumerate(reversed(self._steps), start=1):
            ret = r + self.gamma * ret
            out.append((o, a, ret, next_obs, done, self.gamma ** m))
        out.reverse()
        return out
