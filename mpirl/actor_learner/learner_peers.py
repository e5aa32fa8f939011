"""K data-parallel learners (Gorila's several learners; ``topology.learners``): what they agree on each train step.

Learner k draws its part of every batch from the shards (:func:`mpirl.replay.quotas.learner_quotas`), so the K
parts together are the batch one learner would draw. One rule on the learners' communicator, every step, each
collective depending only on the one before:

1. **control** — an ``Iallgather`` of a few float64s per learner: the first learner's stop and checkpoint flags (it
   alone sees the stop conditions, signals and the wall clock), each learner's statistic of its part that the
   loss needs over the whole batch (Ape-X: its smallest sampling probability, for the importance weights'
   normalisation) and, every :data:`CHECK_EVERY` steps, a CRC of its parameters (the job fails naming the step if
   they differ);
2. **gradients** — the losses are sums over the whole batch's rows, so the SUM of the learners' flat gradients (and
   losses) is one learner's on the whole batch: clipping, the finite check, the optimizer and the target update then
   run on identical inputs on every learner, which keeps their parameters identical. The same sum carries a flag
   per learner, set by a learner whose own part's gradient or loss was not finite: every learner learns whose part
   made a skipped batch (:attr:`LearnerPeers.bad_parts`), so the one that holds it diagnoses it and the others say
   whose it was, rather than blaming their own finite part.

At a checkpoint the learners' per-shard sample counts are gathered to the first, which saves them beside the
state they share.
"""

from __future__ import annotations

import math
import zlib
from typing import NamedTuple

import numpy as np
import torch

from mpirl.agents.flat_grads import flat_grad, set_flat_grad, wire_dtype
from mpirl.comm.collectives import Collectives

CHECK_EVERY = 100  # train steps between parameter CRC comparisons (and at every checkpoint)
STOP, CHECKPOINT, STAT, CRC = range(4)


class Control(NamedTuple):
    stop: bool
    checkpoint: bool
    stats: np.ndarray  # each learner's statistic of its part, in learner order


class LearnerPeers:
    """This learner's side of the rule above (collective to construct, on every learner)."""

    def __init__(self, comm, batch_size: int):
        self.comm = comm
        self.index, self.K = comm.rank, comm.size
        self.coll = Collectives(comm)
        self.total = batch_size  # rows of the whole batch: the losses' denominator
        self.mine = np.zeros(4)
        self.all = np.zeros((self.K, 4))
        # The flat gradient, then the losses, then a flag per learner (sized by the first sum).
        self.grad = self.summed = np.zeros(0, np.float32)
        self.bad_parts: list[int] = []  # the learners whose own part was not finite in the last step's sums
        self._bad_values: list[int] = []  # those of this step's sum_values, until its sum_grads
        self.last_crc = 0

    @property
    def lead(self) -> bool:
        return self.index == 0

    def control(self, stop: bool, checkpoint: bool, stat: float, params: np.ndarray | None, steps: int,
                poll=None) -> Control:
        """The step's agreement (see the module). ``params`` hashed when ``steps`` is due for a check."""
        m = self.mine
        m[STOP], m[CHECKPOINT], m[STAT] = float(stop), float(checkpoint), stat
        m[CRC] = self.crc(params) if params is not None else -1.0
        self.coll.gather(m, self.all, poll)
        crcs = self.all[:, CRC]
        if m[CRC] >= 0 and len(set(crcs.tolist())) != 1:
            raise RuntimeError(f"the learners' parameters differ after train step {steps} (CRC32 "
                               f"{[int(c) for c in crcs]}): the gradient allreduce or an optimizer went its own way")
        return Control(bool(self.all[0, STOP]), bool(self.all[0, CHECKPOINT]), self.all[:, STAT].copy())

    def crc(self, params: np.ndarray) -> float:
        self.last_crc = zlib.crc32(np.ascontiguousarray(params).tobytes())
        return float(self.last_crc)

    def sum_grads(self, params, *losses: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's ``.grad`` replaced by the sum over the learners; the summed losses, in order.
        :attr:`bad_parts`: the learners whose own gradient or losses were not finite."""
        params = list(params)
        n, k = sum(p.numel() for p in params), len(losses)
        dtype = wire_dtype(params)  # float32 (float64 for networks run in float64: tests/learners_job.py)
        if self.grad.size != n + k + self.K or self.grad.dtype != dtype:
            self.grad, self.summed = np.zeros(n + k + self.K, dtype), np.zeros(n + k + self.K, dtype)
        flat_grad(params, self.grad[:n])
        self.grad[n:n + k] = [float(x.detach()) for x in losses]
        self.grad[n + k:] = 0.0
        # (a sum is finite iff every value is, barring an overflow of huge ones: then this part is the one to name)
        self.grad[n + k + self.index] = 0.0 if np.isfinite(self.grad[:n + k].sum()) else 1.0
        self.coll.sum(self.grad, self.summed)
        set_flat_grad(params, self.summed[:n])
        # a step's values (summed first) poisoned by a part explain a sum that is not finite before its gradients do
        self.bad_parts = self._bad_values or np.flatnonzero(self.summed[n + k:]).tolist()
        self._bad_values = []
        return [torch.tensor(float(x)) for x in self.summed[n:n + k]]

    def others_part(self) -> str:
        """'' when this learner's own part was not finite (or none was: the sum overflowed), else the learners whose
        part was, in words, for a skipped batch's diagnosis."""
        if not self.bad_parts or self.index in self.bad_parts:
            return ""
        whose = ", ".join(str(j) for j in self.bad_parts)
        return (f"learner {whose}'s part of the batch was not finite (this learner's part was; that learner's "
                "message names what)")

    def sum_values(self, values) -> np.ndarray:
        """A few float64 values summed over the learners (counts a loss divides by), on every learner. Like
        :meth:`sum_grads`, it notes the learners whose values were not finite: the step's :attr:`bad_parts` are
        theirs (the sum then poisons every part's loss)."""
        v = len(values)
        mine = np.zeros(v + self.K)
        mine[:v] = values
        mine[v + self.index] = 0.0 if np.isfinite(mine[:v]).all() else 1.0
        out = np.empty_like(mine)
        self.coll.sum(mine, out)
        self._bad_values = np.flatnonzero(out[v:]).tolist()
        return out[:v]

    def gather_counts(self, counts: list[int]) -> list[list[int]] | None:
        """Every learner's per-shard counts, on the first learner (None on the others)."""
        mine = np.asarray(counts, np.int64)
        out = np.zeros((self.K, len(mine)), np.int64)
        self.comm.Gather(mine, out if self.lead else None, root=0)
        return out.tolist() if self.lead else None


def smallest(probs: np.ndarray | None) -> float:
    """A part's smallest sampling probability (inf for none): the statistic Ape-X's weights need."""
    return float(probs.min()) if probs is not None and len(probs) else math.inf
