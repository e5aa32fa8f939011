"""The gradient exchanges' rules, apart from their messages (pure: no MPI, no torch).

* ``async`` (A3C, Gorila): a gradient computed on version ``v`` arriving at version ``V`` has staleness ``V - v``; it
  is applied when that is at most ``max_staleness``, else dropped (:func:`accept`).
* ``sync`` (DPPO's leader): :class:`Rounds`. A round collects gradients of the current version; it closes once
  ``workers - stragglers`` of them are in, and the server averages them (in rank order), steps and answers the
  round's workers. A gradient of an older version (its round closed without it) is dropped and its worker answered
  at once with the current parameters.
* ``allreduce`` (DD-PPO): :func:`preempted`. In its rollout of round k a worker ends early once
  ``ceil(sync_frac * workers)`` workers have finished round k (a shared cumulative counter,
  :mod:`mpirl.comm.counter`) and it has played at least its minimum of steps. The worker itself is not among the
  finished, so with ``sync_frac = 1`` nobody is ever preempted.
"""

from __future__ import annotations

import math


def accept(version_now: int, version_grad: int, max_staleness: int) -> tuple[bool, int]:
    """(apply it?, its staleness) for an asynchronous gradient."""
    staleness = version_now - version_grad
    if staleness < 0:
        raise ValueError(f"a gradient of version {version_grad} from the future (the server is at {version_now})")
    return staleness <= max_staleness, staleness


class Rounds:
    """The synchronous server's rounds: which workers' gradients are in the current one."""

    def __init__(self, workers: int, stragglers: int):
        if not 0 <= stragglers < workers:
            raise ValueError(f"stragglers must be in [0, {workers}), got {stragglers}")
        self.quorum = workers - stragglers
        self.members: list[int] = []

    def offer(self, worker: int, version_grad: int, version_now: int) -> bool:
        """Join ``worker``'s gradient to the round (True), or drop it: computed before the round's version."""
        if version_grad > version_now:
            raise ValueError(f"a gradient of version {version_grad} from the future (the server is at {version_now})")
        if version_grad < version_now:
            return False
        if worker in self.members:
            raise RuntimeError(f"worker {worker} sent two gradients of version {version_now}")
        self.members.append(worker)
        return True

    def ready(self) -> bool:
        return len(self.members) >= self.quorum

    def close(self) -> list[int]:
        """The closed round's workers, in rank order; the next round starts empty."""
        out, self.members = sorted(self.members), []
        return out


def quorum_of(workers: int, sync_frac: float) -> int:
    """Finished workers that preempt the others' rollouts (DD-PPO's 60 %: ceil(0.6 W))."""
    return math.ceil(sync_frac * workers - 1e-9)


def preempted(finished: int, workers: int, sync_frac: float, steps: int, min_steps: int) -> bool:
    """Does a worker that has played ``steps`` of its rollout end it now, ``finished`` workers having finished?"""
    return steps >= min_steps and finished >= quorum_of(workers, sync_frac) and finished < workers
