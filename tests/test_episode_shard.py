"""The episode shard behind the buffer loop's interface: what it samples is what was stored, weights flow back
behind the slot versions, AccMER's reuse block is copied from its cache, and a stop before a batch is held
still gets a reply."""

from __future__ import annotations

import numpy as np
import pytest

from mpirl.comm.messages import sample_layout
from mpirl.replay.episode_shard import EpisodeShard

T, N = 6, 3
SPEC = {"obs": ((T + 1, N, 2), np.dtype(np.uint8)), "actions": ((T + 1, N), np.dtype(np.int64)),
        "reward": ((T + 1,), np.dtype(np.float32)), "filled": ((T + 1,), np.dtype(np.bool_))}


def episodes(first: int, k: int) -> dict:
    """k episodes whose every field carries its number (first, first + 1, ...), lengths 3..T."""
    out = {name: np.zeros((k, *shape), dtype) for name, (shape, dtype) in SPEC.items()}
    for i in range(k):
        length = 3 + (first + i) % (T - 2)
        out["obs"][i, :length + 1] = (first + i) % 256
        out["actions"][i, :length] = first + i
        out["reward"][i, :length] = first + i
        out["filled"][i, :length] = True
    return out


def reply(k: int):
    lay = sample_layout(SPEC, k)
    buf = lay.buffer()
    return lay.views(buf, k)


@pytest.mark.parametrize("sampler", ["uniform", "accmer"])
def test_sampled_episodes_are_the_stored_ones(sampler):
    shard = EpisodeShard(SPEC, 20, sampler, batch=8)
    shard.add(episodes(0, 20))
    rng = np.random.default_rng(0)
    for _ in range(12):  # across AccMER windows (W = 20 // 8 = 2)
        out = reply(8)
        s = shard.sample_into(8, rng, out)
        assert len(set(s.ids.tolist())) == 8
        number = out["actions"][:, 0, 0]  # every row carries its episode's number
        np.testing.assert_array_equal(number, s.ids)  # slot i holds episode i (one pass of the ring)
        np.testing.assert_array_equal(out["reward"][:, 0], s.ids.astype(np.float32))
        shard.update_priorities(s.ids, s.versions, np.linspace(0.1, 2.0, 8))


def test_weights_of_refilled_slots_are_dropped_and_new_episodes_start_at_the_initial_weight():
    shard = EpisodeShard(SPEC, 10, "accmer", batch=4, alpha=0.5, discount=0.8)
    shard.add(episodes(0, 10))
    rng = np.random.default_rng(1)
    s = shard.sample_into(4, rng, reply(4))
    shard.add(episodes(10, 10))  # every slot refilled while the weights were in flight
    stale = shard.update_priorities(s.ids, s.versions, np.full(4, 5.0))
    assert stale == 4
    np.testing.assert_allclose(shard.raw_priority[:10], 0.8)  # the initial 1.0, decayed once; no 5.0 landed


def test_a_reply_before_a_batch_is_held_still_has_rows():
    shard = EpisodeShard(SPEC, 10, "uniform", batch=8)
    shard.add(episodes(0, 3))
    out = reply(8)
    s = shard.sample_into(8, np.random.default_rng(2), out)
    assert len(s.ids) == 8 and set(s.ids.tolist()) <= {0, 1, 2}
    np.testing.assert_array_equal(out["actions"][:, 0, 0], s.ids)
