"""Batch quotas over several shards: even, and proportional to insertion rate."""

import math

import pytest

from mpirl.replay.quotas import RateMeter, even_quotas, rate_quotas


def test_even():
    assert even_quotas(512, 2) == [256, 256]
    assert even_quotas(64, 3) == [22, 21, 21]


def test_rate_proportional_sums_to_n_and_keeps_one_each():
    q = rate_quotas(512, [300.0, 100.0])
    assert sum(q) == 512 and q[0] == pytest.approx(3 * q[1], abs=2)
    q = rate_quotas(64, [1000.0, 0.0, 1.0])
    assert sum(q) == 64 and min(q) >= 1 and q[0] == max(q)
    assert rate_quotas(10, [math.nan, math.nan]) == [5, 5]  # no rates yet
    with pytest.raises(ValueError):
        rate_quotas(2, [1, 1, 1])


def test_rate_meter_windows():
    m = RateMeter(window=1.0)
    assert math.isnan(m.update(0.0, 0))
    assert math.isnan(m.update(0.5, 50))
    assert m.update(1.0, 200) == pytest.approx(200.0)
    assert m.update(1.5, 300) == pytest.approx(200.0)  # window not over: keeps the last rate
    assert m.update(3.0, 500) == pytest.approx(150.0)
