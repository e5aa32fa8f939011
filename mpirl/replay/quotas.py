"""How many samples of a batch of N each of R replay shards serves.

* ``even``: N/R each (the first N mod R shards one more).
* ``rate``: proportional to each shard's recent insertion rate, as the paper
  suggests for edges that generate experiences at different speeds; every shard
  keeps at least one sample so its priorities keep flowing back.

Importance weights then use each sample's true probability, quota_b / N times
its probability within shard b (see :func:`mpirl.replay.weights.importance_weights`).
"""

from __future__ import annotations

import numpy as np


def even_quotas(n: int, shards: int) -> list[int]:
    base, extra = divmod(n, shards)
    return [base + (i < extra) for i in range(shards)]


def rate_quotas(n: int, rates) -> list[int]:
    """Quotas summing to ``n``, proportional to ``rates`` (largest remainder), each >= 1.

    Falls back to even quotas while no rate is known (all zero or NaN).
    """
    rates = np.nan_to_num(np.asarray(rates, dtype=np.float64), nan=0.0).clip(min=0.0)
    r = len(rates)
    if n < r:
        raise ValueError(f"a batch of {n} cannot give each of {r} shards a sample")
    if rates.sum() <= 0:
        return even_quotas(n, r)
    ideal = 1 + (n - r) * rates / rates.sum()  # one each, the rest by rate
    quotas = np.floor(ideal).astype(np.int64)
    short = n - int(quotas.sum())
    quotas[np.argsort(-(ideal - quotas), kind="stable")[:short]] += 1
    return quotas.tolist()


class RateMeter:
    """Rate of a cumulative counter over windows of at least ``window`` seconds."""

    def __init__(self, window: float = 2.0):
        self.window = window
        self.t0: float | None = None
        self.c0 = 0
        self.rate = float("nan")

    def update(self, t: float, count: int) -> float:
        if self.t0 is None:
            self.t0, self.c0 = t, count
        elif t - self.t0 >= self.window:
            self.rate = (count - self.c0) / (t - self.t0)
            self.t0, self.c0 = t, count
        return self.rate


def max_quota(n: int, shards: int, mode: str) -> int:
    """The most samples one shard can be asked for (sizes its message buffers)."""
    return -(-n // shards) if mode == "even" else n - (shards - 1)


def learner_quotas(quotas: list[int], learners: int) -> list[list[int]]:
    """Each of K data-parallel learners' samples from each shard, for one batch of ``sum(quotas)``: the batch one
    learner would draw (shard b's ``quotas[b]`` rows after shard b-1's) cut into K consecutive parts of even size
    (the first ``N mod K`` one row more); learner k asks shard b for its part's rows from b (0 for some shards
    when K or R is large)."""
    n = sum(quotas)
    if not 1 <= learners <= n:
        raise ValueError(f"{learners} learners cannot each train a part of a batch of {n}")
    bounds = np.cumsum([0] + even_quotas(n, learners))
    starts = np.cumsum([0] + list(quotas))
    return [[int(max(0, min(hi, starts[b + 1]) - max(lo, starts[b]))) for b in range(len(quotas))]
            for lo, hi in zip(bounds[:-1], bounds[1:])]
