"""Samples per insert: hold actors back so the learner replays each experience about k times.

Ape-X lets actors run free; with a few cores shared by actors and the learner
(a laptop, a 2-core CI machine) the actors then take the CPU the learner needs
and every experience is trained on a fraction of a time. A ratio limit in the
manner of Reverb's ``SampleToInsertRatio`` fixes the replay ratio instead:

    inserted <= warm-up + trained samples / samples_per_insert

Each actor enforces its own share of that budget, from what it already knows:
the parameter version it holds (the learner publishes version v after
(v - 1) * n_update train steps of batch N) and how many transitions it has
sent. The warm-up lets every buffer reach ``learning_starts`` even when its
group has fewer actors than another, so the learner never waits for data that
a throttled actor holds back; the budget runs one broadcast ahead of the
learner, so actors and learner overlap instead of taking turns.
"""

from __future__ import annotations

import math


class InsertBudget:
    """How many transitions one actor may have sent while it holds parameter ``version``."""

    def __init__(self, samples_per_insert: float, batch_size: int, n_update: int, n_actors: int,
                 learning_starts: int, buffers: int, group_actors: int, slack: int):
        self.enabled = samples_per_insert > 0
        per_buffer = math.ceil(learning_starts / buffers)
        self.warm = math.ceil(per_buffer / max(group_actors, 1)) + slack
        # Transitions this actor may add per broadcast: its share of n_update * N / k.
        self.per_version = n_update * batch_size / samples_per_insert / n_actors if self.enabled else math.inf

    def allowed(self, version: int) -> float:
        """Transitions allowed once version ``version`` (1 = the initial weights) has arrived."""
        if not self.enabled:
            return math.inf
        return self.warm + max(version, 1) * self.per_version

    def over(self, sent: int, version: int) -> bool:
        return sent >= self.allowed(version)

    def close(self) -> None:
        """Nothing to end: the budget is the sender's own arithmetic (a budget granted by the receiver ends its
        line here)."""
