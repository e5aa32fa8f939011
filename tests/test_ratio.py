"""The samples-per-insert budget an actor keeps to."""

import math

from mpirl.replay.ratio import InsertBudget


def test_off_means_unlimited():
    b = InsertBudget(0.0, 32, 16, 2, 5000, 1, 2, slack=44)
    assert not b.enabled and b.allowed(1) == math.inf and not b.over(10**12, 1)


def test_budget_grows_by_one_broadcast_of_trained_samples_over_the_ratio():
    # 2 actors, ratio 8: a broadcast (16 batches of 32 = 512 samples) buys each actor 512/8/2 = 32.
    b = InsertBudget(8.0, 32, 16, 2, 5000, 1, 2, slack=44)
    assert b.warm == 2500 + 44
    assert b.allowed(1) == 2544 + 32
    assert b.allowed(11) - b.allowed(10) == 32
    assert b.over(2576, 1) and not b.over(2575, 1)


def test_every_buffer_reaches_learning_starts_with_uneven_groups():
    # 3 actors on 2 buffers: the buffer with one actor must still get learning_starts / 2.
    lone = InsertBudget(4.0, 64, 16, 3, 1000, 2, 1, slack=0)
    pair = InsertBudget(4.0, 64, 16, 3, 1000, 2, 2, slack=0)
    assert 1 * lone.warm >= 500 and 2 * pair.warm >= 500
