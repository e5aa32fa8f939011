"""Episode store and episode samplers (mpirl.replay.episodes, mpirl.replay.samplers): pure numpy, no MPI."""
import numpy as np
import pytest

from mpirl.replay.episodes import EpisodeStore
from mpirl.replay.samplers import AccMERSampler, Picks, UniformSampler
from mpirl.replay import snapshot

T, N = 6, 3  # 6 steps at most, 3 agents
SPEC = {"obs": ((T + 1, N, 2, 2, 3), np.uint8), "state": ((T + 1, 4, 4, 3), np.uint8),
        "avail": ((T + 1, N, 6), np.bool_), "actions": ((T + 1, N), np.int64),
        "reward": ((T + 1,), np.float32), "terminated": ((T + 1,), np.bool_), "filled": ((T + 1,), np.bool_)}


def episodes(numbers, lengths, garbage=False):
    """Episodes whose every non-padding entry encodes the episode number (1-based so it is never 0).

    ``garbage``: the padding rows hold nonzero values too (a careless sender)."""
    k = len(numbers)
    out = {}
    for name, (shape, dtype) in SPEC.items():
        col = (np.asarray(numbers) % 200 + 1).reshape((k,) + (1,) * len(shape))
        out[name] = np.broadcast_to(col, (k, *shape)).astype(dtype).copy()
    t = np.arange(T + 1)
    for i, steps in enumerate(lengths):
        out["filled"][i] = t < steps
        out["terminated"][i] = t == steps - 1
        if not garbage:
            for name in SPEC:
                if name != "filled":
                    out[name][i, steps + 1:] = 0
    return out


def assert_episode(batch, row, number, steps):
    v = number % 200 + 1
    for name in SPEC:
        a = batch[name][row]
        if name == "filled":
            np.testing.assert_array_equal(a, np.arange(T + 1) < steps)
        elif name == "terminated":
            np.testing.assert_array_equal(a, np.arange(T + 1) == steps - 1)
        else:
            assert (a[:steps + 1] == np.asarray(v).astype(a.dtype)).all(), name
            assert not a[steps + 1:].any(), f"{name}: padding after row {steps} not cleared"


# ---------------------------------------------------------------- the store
def test_store_insert_gather_lengths_and_fifo_overwrite():
    store = EpisodeStore(SPEC, capacity=4)
    assert store.rows == T + 1 and store.size == 0 and store.capacity == 4
    ids = store.add(episodes([0, 1, 2], [6, 3, 1]))
    assert ids.tolist() == [0, 1, 2] and store.size == 3
    assert store.versions[:3].tolist() == [0, 1, 2] and store.versions[3] == -1
    assert store.lengths[:3].tolist() == [6, 3, 1]
    batch = store.batch_arrays(3)
    store.gather(np.array([2, 0, 1]), batch)
    for row, (num, steps) in enumerate([(2, 1), (0, 6), (1, 3)]):
        assert_episode(batch, row, num, steps)
    # two more: slot 3, then the oldest (slot 0) is overwritten with a new version
    ids = store.add(episodes([3, 4], [2, 4]))
    assert ids.tolist() == [3, 0] and store.size == 4 and store.inserted == 5
    assert store.versions.tolist() == [4, 1, 2, 3] and store.lengths.tolist() == [4, 3, 1, 2]
    assert store.oldest_first().tolist() == [1, 2, 3, 0]
    store.gather(np.array([0]), batch)
    assert_episode(batch, 0, 4, 4)
    assert store.nbytes >= sum(a.nbytes for a in store.fields.values()) + 2 * 8 * 4
    with pytest.raises(IndexError):
        EpisodeStore(SPEC, 4).gather(np.array([0]), batch)  # nothing filled yet


def test_store_clears_padding_of_a_shorter_episode_over_a_longer_one():
    store = EpisodeStore(SPEC, capacity=1)
    store.add(episodes([7], [6]))  # a full-length episode fills every row
    store.add(episodes([8], [2], garbage=True))  # shorter, and its sender left junk in the padding
    assert store.lengths[0] == 2 and store.versions[0] == 1
    batch = store.batch_arrays(1)
    store.gather(np.array([0]), batch)
    assert_episode(batch, 0, 8, 2)  # rows 0..2 the episode (row 2 = final observation), 3.. zero
    for name in SPEC:
        assert not store.fields[name][0, 3:].any()


def test_store_more_episodes_than_capacity_and_bad_input():
    store = EpisodeStore(SPEC, capacity=2)
    ids = store.add(episodes([0, 1, 2], [1, 2, 3]))  # only the last two are kept
    assert sorted(ids.tolist()) == [0, 1] and store.lengths[ids].tolist() == [2, 3]
    bad = episodes([5], [3])
    bad["filled"][0] = [True, False, True, False, False, False, False]  # not a prefix
    with pytest.raises(ValueError, match="first L rows"):
        store.add(bad)
    with pytest.raises(ValueError, match="time axis"):
        EpisodeStore({**SPEC, "state": ((T, 4, 4, 3), np.uint8)}, 2)
    with pytest.raises(ValueError, match="filled"):
        EpisodeStore({k: v for k, v in SPEC.items() if k != "filled"}, 2)


def test_store_snapshot_restore_round_trip(tmp_path):
    store = EpisodeStore(SPEC, capacity=3)
    store.add(episodes([0, 1, 2, 3], [1, 2, 3, 4]))  # full; slot 0 holds episode 3
    path = tmp_path / "episodes.npz"
    snapshot.save(path, store.snapshot(), train_steps=9)
    arrays, meta = snapshot.load(path)
    assert meta == {"train_steps": 9} and arrays["filled"].shape == (3, T + 1)
    again = EpisodeStore(SPEC, capacity=3)
    ids = again.restore(arrays)
    assert ids.tolist() == [0, 1, 2] and again.lengths.tolist() == [2, 3, 4]  # oldest first
    batch = again.batch_arrays(3)
    again.gather(ids, batch)
    for row, (num, steps) in enumerate([(1, 2), (2, 3), (3, 4)]):
        assert_episode(batch, row, num, steps)
    assert len(EpisodeStore(SPEC, 2).restore(EpisodeStore(SPEC, 2).snapshot())) == 0


def test_gather_picks_keeps_the_cached_reuse_block():
    store = EpisodeStore(SPEC, capacity=8)
    store.add(episodes(list(range(8)), [3] * 8))
    batch = store.batch_arrays(4)
    store.gather_picks(Picks(np.array([5, 6, 0, 1]), np.zeros(4, np.int64), fresh=True, reuse=2), batch)
    for row, num in enumerate([5, 6, 0, 1]):
        assert_episode(batch, row, num, 3)
    batch["reward"][:2] = -1  # marks the cached rows: not fresh, so they must stay untouched
    store.gather_picks(Picks(np.array([5, 6, 2, 3]), np.zeros(4, np.int64), fresh=False, reuse=2), batch)
    assert (batch["reward"][:2] == -1).all()
    assert_episode(batch, 2, 2, 3) and assert_episode(batch, 3, 3, 3)


# ---------------------------------------------------------------- samplers
def filled_sampler(sampler, d):
    sampler.on_insert(np.arange(d), np.arange(d))
    return sampler


def test_uniform_reaches_every_slot_evenly_without_duplicates():
    d, b, steps = 50, 10, 4000
    s = filled_sampler(UniformSampler(64), d)
    rng = np.random.default_rng(0)
    counts = np.zeros(64, np.int64)
    for _ in range(steps):
        p = s.sample(b, d, rng)
        assert len(np.unique(p.ids)) == b and p.reuse == 0 and not p.fresh
        np.testing.assert_array_equal(p.versions, p.ids)
        counts[p.ids] += 1
    assert counts[d:].sum() == 0  # never an unfilled slot
    expected = steps * b / d  # 800 each
    chi2 = ((counts[:d] - expected) ** 2 / expected).sum()
    assert chi2 < 90, chi2  # 49 degrees of freedom: p(chi2 > 90) ~ 3e-4
    assert s.update(p.ids, p.versions, np.ones(b)) == 0
    with pytest.raises(ValueError, match="distinct"):
        s.sample(b, b - 1, rng)


@pytest.mark.parametrize("seed", [0, 1])
def test_accmer_alpha0_is_uniform(seed):
    d, b, steps = 40, 8, 4000
    s = filled_sampler(AccMERSampler(40, b, alpha=0.0), d)
    rng = np.random.default_rng(seed)
    counts = np.zeros(d, np.int64)
    w = np.linspace(0, 5, d)  # weights must not matter
    for _ in range(steps):
        p = s.sample(b, d, rng)
        assert p.reuse == 0 and not p.fresh and len(np.unique(p.ids)) == b
        counts[p.ids] += 1
        s.update(p.ids, p.versions, w[p.ids])
    expected = steps * b / d
    assert counts.min() > 0.8 * expected and counts.max() < 1.2 * expected
    assert ((counts - expected) ** 2 / expected).sum() < 75  # 39 degrees of freedom


def test_accmer_alpha1_is_all_reuse():
    d, b = 20, 5
    s = filled_sampler(AccMERSampler(32, b, alpha=1.0), d)
    rng = np.random.default_rng(0)
    p = s.sample(b, d, rng)
    assert p.reuse == b and p.fresh
    for _ in range(s.window - 1):
        q = s.sample(b, d, rng)
        assert not q.fresh and q.ids.tolist() == p.ids.tolist()


def test_accmer_window_topk_disjoint_and_rechosen_after_w_steps():
    d, b, cap = 100, 8, 128
    s = filled_sampler(AccMERSampler(cap, b, alpha=0.5), d)
    assert s.reuse == 4
    rng = np.random.default_rng(3)
    # distinct weights: the four highest are slots 17, 3, 88, 50
    w = np.linspace(0.1, 0.9, d)
    w[[17, 3, 88, 50]] = [9.0, 8.0, 7.0, 6.0]
    s.update(np.arange(d), np.arange(d), w)  # also one decay step
    first = s.sample(b, d, rng)
    W = d // b
    assert first.fresh and s.window == W == 12
    assert sorted(first.ids[:4].tolist()) == [3, 17, 50, 88]
    seen = [first]
    for _ in range(W - 1):
        p = s.sample(b, d, rng)
        assert not p.fresh and p.ids[:4].tolist() == first.ids[:4].tolist()
        seen.append(p)
    for p in seen:
        assert len(np.unique(p.ids)) == b  # no duplicates within a batch
        assert not set(p.ids[4:].tolist()) & set(p.ids[:4].tolist())  # the parts are disjoint
        assert ((p.ids >= 0) & (p.ids < d)).all()
    # the window is over: the next sample re-chooses, now by the current weights
    s.update(np.array([60, 61, 62, 63]), np.array([60, 61, 62, 63]), np.full(4, 100.0))
    p = s.sample(b, d, rng)
    assert p.fresh and sorted(p.ids[:4].tolist()) == [60, 61, 62, 63]


def test_accmer_uniform_part_covers_every_other_slot():
    d, b = 30, 8
    s = filled_sampler(AccMERSampler(30, b, alpha=0.5), d)
    w = np.zeros(d)
    w[:4] = 10.0
    s.update(np.arange(d), np.arange(d), w)
    rng = np.random.default_rng(5)
    counts = np.zeros(d, np.int64)
    for _ in range(d // b):  # one window: the reuse set stays {0, 1, 2, 3}
        p = s.sample(b, d, rng)
        counts[p.ids[4:]] += 1
    for _ in range(3000):  # keep the reuse set fixed: re-open the same window
        s.steps_left = 2
        p = s.sample(b, d, rng)
        assert sorted(p.ids[:4].tolist()) == [0, 1, 2, 3]
        counts[p.ids[4:]] += 1
    assert counts[:4].sum() == 0
    expected = counts.sum() / (d - 4)
    assert counts[4:].min() > 0.8 * expected and counts[4:].max() < 1.2 * expected


def test_accmer_weights_decay_stale_writes_and_refill():
    d, b = 16, 4
    s = filled_sampler(AccMERSampler(16, b, alpha=0.5, discount=0.8, initial_weight=1.0), d)
    np.testing.assert_allclose(s.weights, 1.0)
    rng = np.random.default_rng(0)
    p = s.sample(b, d, rng)
    s.on_insert(p.ids[:1], [1000])  # slot refilled between sample and update
    stale = s.update(p.ids, p.versions, np.array([5.0, 6.0, 7.0, 8.0]))
    assert stale == 1
    w = s.weights
    assert w[p.ids[0]] == pytest.approx(1.0 * 0.8)  # the refill's initial weight, decayed once
    np.testing.assert_allclose(w[p.ids[1:]], np.array([6.0, 7.0, 8.0]) * 0.8)
    others = np.setdiff1d(np.arange(d), p.ids)
    np.testing.assert_allclose(w[others], 0.8)
    for k in range(2, 6):  # the whole table decays by the discount each step
        s.update(p.ids[:0], p.versions[:0], np.zeros(0))
        np.testing.assert_allclose(s.weights[others], 0.8 ** k)
    s.on_insert(np.array([others[0]]), [2000])  # a refilled slot starts again at initial_weight
    assert s.weights[others[0]] == pytest.approx(1.0)
    assert s.versions[others[0]] == 2000
    # many steps: the lazy decay scale is folded back without losing the values
    for _ in range(2000):
        s.update(np.zeros(0), np.zeros(0), np.zeros(0))
    s.on_insert(np.array([0]), [3000])
    assert s.weights[0] == pytest.approx(1.0) and 0 < s.weights[1] < 1e-150 and np.isfinite(s._table).all()
    with pytest.raises(ValueError, match="finite"):
        s.update(np.array([0]), np.array([3000]), np.array([np.nan]))


def test_accmer_refilled_reuse_member_keeps_its_cached_version():
    d, b = 16, 4
    s = filled_sampler(AccMERSampler(16, b, alpha=0.5), d)
    rng = np.random.default_rng(1)
    first = s.sample(b, d, rng)
    member = int(first.ids[0])
    s.on_insert(np.array([member]), [99])  # overwritten during the window
    p = s.sample(b, d, rng)
    assert not p.fresh and p.ids[0] == member and p.versions[0] == first.versions[0] != 99
    assert member not in p.ids[2:].tolist()
    assert s.update(p.ids, p.versions, np.full(b, 3.0)) == 1  # its write is dropped
    assert s.weights[member] == pytest.approx(0.8)  # the new episode: initial weight, decayed


def test_accmer_edge_cases():
    s = AccMERSampler(10, 4, alpha=0.5)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="distinct"):
        s.sample(4, 3, rng)  # d < b: refused (the learner samples once size >= learning_starts >= b)
    with pytest.raises(ValueError, match="built for"):
        s.sample(5, 10, rng)
    filled_sampler(s, 4)
    p = s.sample(4, 4, rng)  # d == b: W = 1, every slot in the batch
    assert p.fresh and sorted(p.ids.tolist()) == [0, 1, 2, 3] and s.window == 1
    assert s.sample(4, 4, rng).fresh  # re-chosen every step
    assert AccMERSampler(10, 3, alpha=0.5).reuse == 2  # round half up
    for bad in (dict(alpha=1.5), dict(discount=0.0), dict(initial_weight=np.inf)):
        with pytest.raises(ValueError):
            AccMERSampler(10, 4, **bad)


# ---------------------------------------------------------------- the bench, at a tiny scale
def test_marl_bench_measures_all_three_and_reports_llc(capsys):
    from mpirl.bench import marl
    rows = marl.run(reps=5, ds=(40,), bs=(8,), steps=10, seconds=0.005)
    assert [r.reference for r in rows[:3]] == [marl.NUMPY, marl.NUMPY, marl.UNIFORM]
    for r in rows:
        for impl, values in r.values.items():
            assert len(values) >= 1 and all(np.isfinite(values)) and all(v > 0 for v in values), (r.name, impl)
        assert np.isfinite(r.ratio)
    assert "amortised over W=5" in rows[1].name
    out = capsys.readouterr().out
    assert "uniform/accmer" in out and "LLC misses: " in out  # counted, or "not countable here (why)"
