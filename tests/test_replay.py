"""Tests for mpirl.replay (pure numpy, no MPI)."""
import numpy as np
import pytest

from mpirl.replay.nstep import NStepAccumulator
from mpirl.replay.ring import RingStore
from mpirl.replay.shard import PrioritizedShard
from mpirl.replay.weights import importance_weights, linear_schedule
from mpirl.replay.sumtree import SumTree, last_unique

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
        "next_obs": ((4,), np.float32), "done": ((), np.bool_), "discount": ((), np.float32)}


def make_records(start, n, spec=SPEC):
    """Records whose every field encodes the record number start..start+n-1."""
    num = np.arange(start, start + n)
    recs = {}
    for name, (shape, dtype) in spec.items():
        col = num.reshape((n,) + (1,) * len(shape)) % (256 if dtype == np.uint8 else 1 << 30)
        recs[name] = np.broadcast_to(col, (n, *shape)).astype(dtype)
    return recs


def new_out(spec, k):
    return {name: np.zeros((k, *shape), dtype) for name, (shape, dtype) in spec.items()}


# ---------------------------------------------------------------- sum tree
def test_sumtree_totals_and_duplicates():
    t = SumTree(5)  # rounded up to 8 leaves internally
    assert t.size == 8 and t.capacity == 5
    t.update(np.array([0, 1, 2, 3, 4]), np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert t.total == 15.0
    t.update(np.array([1, 3, 1]), np.array([10.0, 0.5, 7.0]))  # last value wins for slot 1
    np.testing.assert_array_equal(t.get(np.arange(5)), [1.0, 7.0, 3.0, 0.5, 5.0])
    assert t.total == pytest.approx(16.5)
    assert t.tree[1:8].tolist() == [16.5, 11.5, 5.0, 8.0, 3.5, 5.0, 0.0]  # all parents exact
    with pytest.raises(IndexError):
        t.update(np.array([5]), np.array([1.0]))  # padding leaf is not a slot
    t.clear()
    assert t.total == 0.0


def test_sumtree_bulk_update_matches_incremental():
    rng = np.random.default_rng(0)
    vals = rng.random(1000)
    a, b = SumTree(1000), SumTree(1000)
    a.update(np.arange(1000), vals)  # full rebuild path
    for chunk in np.array_split(rng.permutation(1000), 50):  # incremental path
        b.update(chunk, vals[chunk])
    np.testing.assert_allclose(a.tree, b.tree, rtol=1e-12)
    assert a.total == pytest.approx(vals.sum(), rel=1e-12)


def test_sumtree_find_hand_built():
    t = SumTree(4)
    t.update(np.arange(4), np.array([1.0, 0.0, 2.0, 3.0]))
    u = np.array([0.0, 0.5, 0.999, 1.0, 2.5, 2.999, 3.0, 5.9, 6.0, 100.0, -1.0])
    np.testing.assert_array_equal(t.find(u), [0, 0, 0, 2, 2, 2, 3, 3, 3, 3, 0])
    one = SumTree(1)
    one.update(np.array([0]), np.array([2.0]))
    assert one.find(np.array([0.0, 1.9])).tolist() == [0, 0]
    with pytest.raises(ValueError):
        SumTree(3).find(np.array([0.0]))


def _find_one_at_a_time(tree: SumTree, u: np.ndarray) -> np.ndarray:
    """The descent as find() documents it, one draw at a time in plain Python (a reference)."""
    total, out = tree.tree[1], []
    for x in u.tolist():
        x = 0.0 if not x >= 0.0 else min(x, float(np.nextafter(total, 0.0)))
        node = 1
        while node < tree.size:
            node *= 2
            if x >= tree.tree[node] and tree.tree[node + 1] > 0.0:
                x -= tree.tree[node]
                node += 1
        out.append(node - tree.size)
    return np.array(out, dtype=np.int64)


def test_sumtree_batch_descent_matches_one_draw_at_a_time():
    """find() takes the whole batch down level by level: every draw ends where it would alone (zero leaves,
    draws outside [0, total), NaN, repeats and unsorted draws included)."""
    rng = np.random.default_rng(11)
    for cap in (1, 2, 5, 64, 1000):
        t = SumTree(cap)
        values = rng.random(cap) ** 3
        values[rng.random(cap) < 0.3] = 0.0
        values[rng.integers(0, cap)] = 0.5
        t.update(np.arange(cap), values)
        total = t.total
        u = np.concatenate([rng.random(300) * total, [-1.0, np.nan, 0.0, total, 2 * total, np.inf, -np.inf],
                            np.full(3, total / 2)])
        got = t.find(u)
        np.testing.assert_array_equal(got, _find_one_at_a_time(t, u))
        assert (t.get(got) > 0).all()


def test_stratified_draws_come_with_their_probs_versions_and_priorities():
    """sample_scored is sample, plus probs() and weights_of() of its picks from the same pass; the draws are
    the stratified u_i = (r_i + i) * total / b of the sampler's generator, as they always were."""
    rng = np.random.default_rng(5)
    shard = PrioritizedShard(SPEC, 300, alpha=0.6, eps=0.0)
    raw = (rng.random(260) * 3).astype(np.float32)
    raw[::5] = 0.0  # never drawn
    shard.add(make_records(0, 260), raw)
    sampler = shard.sampler
    for b in (1, 7, 512):
        picks, probs, priorities = sampler.sample_scored(b, shard.size, np.random.default_rng(b))
        u = (np.random.default_rng(b).random(b) + np.arange(b)) * (shard.total / b)
        np.testing.assert_array_equal(picks.ids, _find_one_at_a_time(shard.tree, u))
        np.testing.assert_array_equal(picks.versions, shard.versions[picks.ids])
        np.testing.assert_array_equal(probs, sampler.probs(picks.ids, shard.size))
        np.testing.assert_array_equal(priorities, sampler.weights_of(picks.ids))
        assert probs.dtype == np.float64 and priorities.dtype == np.float32 and (priorities > 0).all()
        assert (np.diff(picks.ids) >= 0).all()  # stratified draws, monotone descent
        again = shard.sample(b, np.random.default_rng(b))
        np.testing.assert_array_equal(again.ids, picks.ids)
        np.testing.assert_array_equal(again.probs, probs)
    with pytest.raises(ValueError):
        PrioritizedShard(SPEC, 8, alpha=0.6).sampler.sample_scored(4, 0, rng)


def test_sumtree_never_returns_zero_leaf_rounding_case():
    # root = fl(fl(a + b) + c) rounds up, so the top draw, after subtracting the
    # left subtree, exceeds c and a naive descent walks into the zero leaf 3.
    t = SumTree(4)
    t.update(np.arange(4), np.array([2.0 ** -25, 7 * 2.0 ** -56, 0.15625, 0.0]))
    top = np.nextafter(t.total, 0.0)
    assert t.find(np.array([top, t.total])).tolist() == [2, 2]


def test_sumtree_never_returns_zero_leaf():
    rng = np.random.default_rng(1)
    n = 1000
    vals = rng.random(n) * 10.0 ** rng.integers(-12, 3, n)
    vals[::2] = 0.0  # zeros interleaved
    vals[-50:] = 0.0  # and a zero tail (plus padding leaves up to 1024)
    t = SumTree(n)
    t.update(np.arange(n), vals)
    total = t.total
    near_top = total - total * np.finfo(float).eps * rng.integers(0, 64, 20000)
    u = np.concatenate([near_top, [total, np.nextafter(total, np.inf), 1e300],
                        rng.random(20000) * total, np.zeros(5)])
    idx = t.find(u)
    assert (vals[idx] > 0).all()
    # prefix boundaries (cumulative sums) and their neighbours land on positive leaves
    cs = np.cumsum(vals)
    for b in (np.nextafter(cs, 0.0), cs, np.nextafter(cs, np.inf)):
        assert (vals[t.find(b)] > 0).all()


def test_sumtree_wide_tree_descent_and_sparse_updates():
    # 70,000 slots: 131,072 leaves, 17 levels of descent; 5,000 padding leaves stay 0.
    rng = np.random.default_rng(2)
    n = 70_000
    vals = rng.random(n) * 10.0 ** rng.integers(-8, 3, n)
    vals[rng.random(n) < 0.3] = 0.0
    t = SumTree(n)
    t.update(np.arange(n), vals)
    cs = np.cumsum(vals)
    u = np.concatenate([rng.random(50_000) * cs[-1], np.nextafter(cs, 0.0)[::7], cs[::7], [cs[-1], 1e300, -1.0]])
    idx = t.find(u)
    assert (vals[idx] > 0).all()
    inside = u[:50_000]  # draws away from boundaries land where a plain prefix-sum search puts them
    np.testing.assert_array_equal(idx[:50_000], np.searchsorted(cs, inside, side="right"))
    # sparse updates of a few slots keep every ancestor exact (same sums as a full rebuild)
    for k in (1, 64, 512, 5000):
        ids = rng.integers(0, n, k)
        new = rng.random(k)
        t.update(ids, new)
        uniq, pos = last_unique(ids)  # SumTree promises the last value of a repeated id
        vals[uniq] = new[pos]
        ref = SumTree(n)
        ref.update(np.arange(n), vals)
        np.testing.assert_array_equal(t.tree, ref.tree)


def test_sumtree_refuses_values_that_would_poison_the_total():
    t = SumTree(8)
    for bad in (np.nan, np.inf, -1.0):
        with pytest.raises(ValueError):
            t.update(np.array([1]), np.array([bad]))
    t.update(np.array([2]), np.array([1.0]))
    assert t.find(np.array([np.nan])).tolist() == [2]  # a NaN draw is read as 0, never out of range


def test_sumtree_sorted_ids_with_repeats_keep_the_last_value():
    t = SumTree(10_000)
    t.update(np.array([3, 3, 5, 9000, 9000, 9000]), np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    assert t.get(np.array([3, 5, 9000])).tolist() == [2.0, 3.0, 6.0] and t.total == 11.0
    t.update(np.array([9000, 3, 9000]), np.array([7.0, 0.5, 8.0]))  # unsorted: the general path
    assert t.get(np.array([3, 9000])).tolist() == [0.5, 8.0] and t.total == 11.5


# ---------------------------------------------------------------- ring store
def test_ring_fifo_overwrite_versions_and_export():
    r = RingStore(SPEC, 5)
    ids = r.add(make_records(0, 3))
    assert ids.tolist() == [0, 1, 2] and r.size == 3
    ids = r.add(make_records(3, 4))  # wraps: records 3,4 -> slots 3,4; 5,6 -> slots 0,1
    assert ids.tolist() == [3, 4, 0, 1]
    assert r.size == 5 and r.inserted == 7
    assert r.fields["action"].tolist() == [5, 6, 2, 3, 4]
    assert r.versions.tolist() == [5, 6, 2, 3, 4]
    out = new_out(SPEC, 8)
    assert r.export(out) == 5
    assert out["action"][:5].tolist() == [2, 3, 4, 5, 6]  # oldest first
    np.testing.assert_array_equal(out["obs"][:5], make_records(2, 5)["obs"])


def test_ring_add_more_than_capacity_keeps_last_rows():
    r = RingStore(SPEC, 4)
    r.add(make_records(0, 1))
    ids = r.add(make_records(1, 10))  # records 1..10, only 7..10 survive
    assert len(ids) == 4
    np.testing.assert_array_equal(r.fields["action"][ids], [7, 8, 9, 10])
    np.testing.assert_array_equal(r.versions[ids], [7, 8, 9, 10])
    assert r.inserted == 11 and r.size == 4
    out = new_out(SPEC, 4)
    r.export(out)
    assert out["action"].tolist() == [7, 8, 9, 10]
    r.add(make_records(11, 1))  # FIFO continues after the kept block
    r.export(out)
    assert out["action"].tolist() == [8, 9, 10, 11]


def test_ring_clear_keeps_versions_unique():
    r = RingStore(SPEC, 4)
    r.add(make_records(0, 3))
    r.clear()
    assert r.size == 0 and (r.versions == -1).all()
    ids = r.add(make_records(0, 2))
    assert ids.tolist() == [0, 1] and r.versions[:2].tolist() == [3, 4]
    out = new_out(SPEC, 4)
    assert r.export(out) == 2 and out["action"][:2].tolist() == [0, 1]


def test_ring_gather_into_preallocated_uint8():
    spec = {"obs": ((2, 3, 3), np.uint8), "action": ((), np.int64)}
    r = RingStore(spec, 300)
    r.add(make_records(0, 300, spec))
    ids = np.array([5, 299, 0, 5, 260])
    out = new_out(spec, 8)
    r.gather(ids, out)
    assert out["obs"].dtype == np.uint8 and r.fields["obs"].dtype == np.uint8
    np.testing.assert_array_equal(out["obs"][:5], r.fields["obs"][ids])
    np.testing.assert_array_equal(out["action"][:5], r.fields["action"][ids])
    assert out["obs"][3, 1, 2, 0] == 5 and out["obs"][4, 0, 0, 0] == 260 % 256
    r2 = RingStore(spec, 10)
    r2.add(make_records(0, 3, spec))
    with pytest.raises(IndexError):
        r2.gather(np.array([3]), out)  # slot not filled yet
    with pytest.raises(ValueError):
        r2.add({"obs": np.zeros((2, 3, 3, 3), np.uint8), "action": np.zeros(2)})


# ---------------------------------------------------------------- shard
def test_sampling_frequencies_follow_p_alpha():
    raw = np.array([0.1, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0])
    for alpha in (0.6, 0.0):
        shard = PrioritizedShard(SPEC, 8, alpha=alpha, eps=1e-6)
        shard.add(make_records(0, 8), raw)
        rng = np.random.default_rng(42)
        draws = np.concatenate([shard.sample(512, rng).ids for _ in range(400)])  # 204,800
        freq = np.bincount(draws, minlength=8) / len(draws)
        p = (raw + 1e-6) ** alpha
        expected = p / p.sum()
        # stratified sampling has at most the multinomial variance: 5 sigma bound
        sigma = np.sqrt(expected * (1 - expected) / len(draws))
        assert (np.abs(freq - expected) < 5 * sigma).all(), (alpha, freq, expected)
    np.testing.assert_allclose(expected, 1 / 8)  # alpha=0 -> uniform


def test_sample_probs_priorities_and_out():
    rng = np.random.default_rng(3)
    raw = rng.random(50).astype(np.float32) * 4
    shard = PrioritizedShard(SPEC, 64, alpha=0.7, eps=0.01)
    shard.add(make_records(0, 50), raw)
    p = (raw.astype(np.float64) + 0.01) ** 0.7
    assert shard.total == pytest.approx(p.sum(), rel=1e-12)
    out = new_out(SPEC, 32)
    s = shard.sample(32, rng, out=out)
    assert s.ids.dtype == np.int64 and s.versions.dtype == np.int64
    assert s.probs.dtype == np.float64 and s.priorities.dtype == np.float32
    assert (s.ids < 50).all()
    np.testing.assert_allclose(s.probs, p[s.ids] / p.sum(), rtol=1e-12)
    np.testing.assert_array_equal(s.priorities, raw[s.ids])
    np.testing.assert_array_equal(s.versions, s.ids)  # first fill: version == slot
    np.testing.assert_array_equal(out["action"], s.ids)
    np.testing.assert_array_equal(out["next_obs"], shard.store.fields["next_obs"][s.ids])
    with pytest.raises(ValueError):
        PrioritizedShard(SPEC, 8, alpha=0.6).sample(4, rng)


def test_update_priorities_drops_stale_slots():
    shard = PrioritizedShard(SPEC, 10, alpha=0.5, eps=0.0)
    shard.add(make_records(0, 10), np.ones(10))
    rng = np.random.default_rng(7)
    s = shard.sample(10, rng)  # stratified over equal priorities: every slot once
    assert sorted(s.ids.tolist()) == list(range(10))
    shard.add(make_records(10, 3), np.full(3, 9.0))  # overwrites slots 0, 1, 2
    new = np.arange(10, 20, dtype=np.float32)
    stale = shard.update_priorities(s.ids, s.versions, new)
    assert stale == 3
    by_slot = dict(zip(s.ids.tolist(), new.tolist()))
    for slot in range(10):
        want = 9.0 if slot < 3 else by_slot[slot]
        assert shard.raw_priority[slot] == want
        assert shard.tree.get(np.array([slot]))[0] == pytest.approx(want ** 0.5)
    assert shard.total == pytest.approx(3 * 3.0 + sum(v ** 0.5 for s_, v in by_slot.items()
                                                       if s_ >= 3))
    # duplicates: last wins; an all-stale update changes nothing
    assert shard.update_priorities([5, 5], shard.versions[[5, 5]], [1.0, 4.0]) == 0
    assert shard.raw_priority[5] == 4.0 and shard.tree.get([5])[0] == pytest.approx(2.0)
    before = shard.tree.tree.copy()
    assert shard.update_priorities([3, 4], [-7, 0], [100.0, 100.0]) == 2
    np.testing.assert_array_equal(shard.tree.tree, before)


def test_update_priorities_matches_a_plain_loop():
    """The compiled feedback path against the rule written out: unsorted ids with
    repeats (last wins), stale versions dropped, raw |p| kept, leaves (|p| + eps) ** alpha."""
    rng = np.random.default_rng(3)
    shard = PrioritizedShard(SPEC, 300, alpha=0.6, eps=1e-3)
    shard.add(make_records(0, 300), rng.random(300))
    for round_ in range(20):
        ids = rng.integers(0, 300, 64)
        if round_ % 2:
            ids.sort()  # sampled ids come sorted; the others take the sorting path
        versions = shard.versions[ids].copy()
        versions[rng.random(64) < 0.2] -= 1  # an older record of the slot
        new = (rng.standard_normal(64) * 3).astype(np.float32 if round_ % 3 else np.float64)
        raw, want_stale = shard.raw_priority.copy(), 0
        for i, v, p in zip(ids, versions, new):
            if shard.versions[i] == v:
                raw[i] = abs(p)
            else:
                want_stale += 1
        assert shard.update_priorities(ids, versions, new) == want_stale
        np.testing.assert_array_equal(shard.raw_priority, raw)
        np.testing.assert_allclose(shard.tree.get(np.arange(300)), (raw.astype(np.float64) + 1e-3) ** 0.6, rtol=1e-6)  # raw is kept as float32
        ref = SumTree(300)
        ref.update(np.arange(300), shard.tree.get(np.arange(300)))
        np.testing.assert_array_equal(shard.tree.tree, ref.tree)  # every ancestor exact


def test_update_priorities_refuses_bad_input_and_writes_nothing():
    shard = PrioritizedShard(SPEC, 10, alpha=0.5)
    shard.add(make_records(0, 10), np.ones(10))
    before, raw = shard.tree.tree.copy(), shard.raw_priority.copy()
    v = shard.versions
    with pytest.raises(IndexError):
        shard.update_priorities([1, 10], v[[1, 1]], [5.0, 5.0])
    with pytest.raises(IndexError):
        shard.update_priorities([2, -1], v[[2, 2]], [5.0, 5.0])  # unsorted and out of range
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="finite"):
            shard.update_priorities([1, 2], v[[1, 2]], [5.0, bad])
    with pytest.raises(ValueError, match="equal length"):
        shard.update_priorities([1, 2], v[[1, 2]], [5.0])
    np.testing.assert_array_equal(shard.tree.tree, before)
    np.testing.assert_array_equal(shard.raw_priority, raw)


def test_replace_and_export_with_priorities():
    shard = PrioritizedShard(SPEC, 6, alpha=1.0, eps=0.0)
    shard.add(make_records(0, 6), np.arange(6) + 1.0)
    old = shard.sample(4, np.random.default_rng(0))
    shard.replace(make_records(100, 4), np.array([1.0, 2.0, 3.0, 4.0]))
    assert shard.size == 4 and shard.total == pytest.approx(10.0)
    assert shard.update_priorities(old.ids, old.versions, np.ones(4)) == 4  # all stale
    shard.add(make_records(104, 4), np.array([5.0, 6.0, 7.0, 8.0]))  # wraps
    out, pri = new_out(SPEC, 6), np.zeros(6, np.float32)
    assert shard.export(out, pri) == 6
    assert out["action"].tolist() == [102, 103, 104, 105, 106, 107]
    assert pri.tolist() == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert shard.total == pytest.approx(33.0)


# ---------------------------------------------------------------- weights
def test_importance_weights():
    probs = np.array([0.5, 0.25, 0.125])
    w = importance_weights(probs, n=8, beta=0.5)
    # (8 P)^-0.5 = [0.5, 0.7071, 1.0] -> normalized by max 1.0
    np.testing.assert_allclose(w, [0.5, np.sqrt(0.5), 1.0], rtol=1e-6)
    assert w.dtype == np.float32 and w.max() == 1.0
    np.testing.assert_array_equal(importance_weights(probs, 8, 0.0), np.ones(3))
    w1 = importance_weights(np.array([0.1, 0.4]), n=10, beta=1.0)
    np.testing.assert_allclose(w1, [1.0, 0.25], rtol=1e-6)


def test_importance_weights_follow_the_formula_in_every_case():
    """(n P)^-beta over its largest (or over (n smallest)^-beta), in float32, for any shape; a NaN probability
    makes every weight NaN (the largest is NaN), a zero one an infinite weight."""
    rng = np.random.default_rng(2)

    def formula(p, n, beta, smallest=None):
        w = np.power(n * np.asarray(p, np.float64), -beta)
        return (w / (w.max() if smallest is None else np.power(n * smallest, -beta))).astype(np.float32)

    for beta in (0.0, 0.4, 0.5, 1.0):
        p = rng.random(512) / 512
        np.testing.assert_array_equal(importance_weights(p, 65_536, beta), formula(p, 65_536, beta))
        np.testing.assert_array_equal(importance_weights(p, 10, beta, smallest=p.min() / 2),
                                      formula(p, 10, beta, p.min() / 2))
        grid = p[:12].reshape(3, 4)
        assert importance_weights(grid, 8, beta).shape == (3, 4)
        np.testing.assert_array_equal(importance_weights(grid, 8, beta), formula(grid, 8, beta))
    assert importance_weights(np.array(0.25), 4, 0.5).shape == ()
    with np.errstate(divide="ignore", invalid="ignore"):
        assert np.isnan(importance_weights(np.array([0.1, np.nan, 0.2]), 8, 0.5)).all()
        w = importance_weights(np.array([0.0, 0.5]), 2, 0.5)
        assert np.isnan(w[0]) and w[1] == 0.0  # inf / inf and 1 / inf, as numpy divides
    with pytest.raises(ValueError):
        importance_weights(np.array([0.5]), 0, 0.5)


def test_the_learners_side_of_the_replay_never_imports_numba():
    """A learner of the proposed placement reads batches, weighs them and sends priorities back: none of it is a
    compiled kernel, so its process never pays numba's import (0.3-0.5 CPU-s a process here). A process of its own,
    as a rank starts (this one has imported numba for the shards' tests), with the replay family's learners'
    modules (Ape-X's imports the baseline's local shard only where it makes one)."""
    import subprocess
    import sys
    code = ("import sys, numpy as np\n"
            "import mpirl.actor_learner.learner, mpirl.actor_learner.batch_sources, mpirl.actor_learner.shard_links\n"
            "import mpirl.algos.apex.learner, mpirl.algos.qmix.learner, mpirl.algos.impala.learner\n"
            "from mpirl.replay.weights import importance_weights, linear_schedule\n"
            "importance_weights(np.full(4, 0.25), 4, linear_schedule(0.4, 1.0, 5, 10), smallest=0.25)\n"
            "print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", (out.stdout, out.stderr[-2000:])


def test_linear_schedule():
    assert linear_schedule(0.4, 1.0, 0, 100) == pytest.approx(0.4)
    assert linear_schedule(0.4, 1.0, 50, 100) == pytest.approx(0.7)
    assert linear_schedule(0.4, 1.0, 500, 100) == pytest.approx(1.0)
    assert linear_schedule(0.4, 1.0, 5, 0) == 1.0


# ---------------------------------------------------------------- n-step
def run_episode(acc, rewards, last_terminated):
    obs = [np.full(2, float(t)) for t in range(len(rewards) + 1)]
    emitted = []
    for t, r in enumerate(rewards):
        end = t == len(rewards) - 1
        emitted += acc.push(obs[t], t, r, obs[t + 1], end and last_terminated,
                            end and not last_terminated)
    return obs, emitted


@pytest.mark.parametrize("terminated", [True, False])
def test_nstep_returns_five_step_episode(terminated):
    g = 0.9
    acc = NStepAccumulator(3, g)
    r = [1.0, 2.0, 3.0, 4.0, 5.0]
    obs, out = run_episode(acc, r, terminated)
    assert len(out) == 5 and len(acc) == 0
    expected_R = [1 + 0.9 * 2 + 0.81 * 3, 2 + 0.9 * 3 + 0.81 * 4, 3 + 0.9 * 4 + 0.81 * 5,
                  4 + 0.9 * 5, 5.0]
    expected_next = [3, 4, 5, 5, 5]
    expected_m = [3, 3, 3, 2, 1]
    for t, (o, a, R, nxt, done, disc) in enumerate(out):
        assert o is obs[t] and a == t
        assert R == pytest.approx(expected_R[t])
        assert nxt is obs[expected_next[t]]
        assert disc == pytest.approx(g ** expected_m[t])
        # only the tail steps whose window hits the end are flushed with done
        assert done == (terminated and t >= 2)
    # the next episode starts clean
    _, out2 = run_episode(acc, [1.0, 1.0], True)
    assert [x[2] for x in out2] == pytest.approx([1.9, 1.0]) and out2[0][1] == 0


def test_nstep_emits_as_window_fills_and_short_episode():
    acc = NStepAccumulator(3, 0.5)
    o = [np.zeros(1) for _ in range(4)]
    assert acc.push(o[0], 0, 1.0, o[1], False, False) == []
    assert acc.push(o[1], 1, 1.0, o[2], False, False) == []
    (tr,) = acc.push(o[2], 2, 1.0, o[3], False, False)
    assert tr[2] == pytest.approx(1.75) and tr[3] is o[3] and tr[4] is False
    assert tr[5] == pytest.approx(0.125) and len(acc) == 2
    acc.clear()
    out = acc.push(o[0], 0, 2.0, o[1], True, True)  # terminated wins over truncated
    assert len(out) == 1 and out[0][4] is True and out[0][5] == pytest.approx(0.5)


def test_atari_shard_bytes_per_slot():
    """A 65,536-slot Atari shard holds uint8 frame stacks and little else: 56,493 B per slot."""
    from mpirl.agents.dqn import transition_spec
    from mpirl.replay.shard import PrioritizedShard
    shard = PrioritizedShard(transition_spec((4, 84, 84), np.uint8), 65_536, alpha=0.6)
    # obs + next_obs 2 x 28,224 B; action 8, reward 4, done 1, discount 4; version 8, raw priority 4;
    # sum tree 2 x 8 B per leaf (65,536 is a power of two)
    assert shard.nbytes == 65_536 * (2 * 28_224 + 8 + 4 + 1 + 4 + 8 + 4 + 16)
    assert shard.store.fields["obs"].dtype == np.uint8


# ---------------------------------------------------------------- snapshots (checkpoint.replay)
def _frames_spec():
    return {"obs": ((4, 6, 6), np.uint8), "action": ((), np.int64), "reward": ((), np.float32),
            "next_obs": ((4, 6, 6), np.uint8), "done": ((), np.bool_), "discount": ((), np.float32)}


def _stream(start, n):
    """Records whose frame stacks share frames as an actor's do (frame t = t in every pixel)."""
    t = np.arange(start, start + n)
    stack = lambda s: np.broadcast_to(((s[:, None] + np.arange(4)) % 256).astype(np.uint8)[:, :, None, None],  # noqa: E731
                                      (n, 4, 6, 6)).copy()
    return {"obs": stack(t), "next_obs": stack(t + 3), "action": t % 4, "reward": t.astype(np.float32),
            "done": t % 7 == 0, "discount": np.full(n, 0.97, np.float32)}


@pytest.mark.parametrize("kind", ["shard", "shard frames once", "baseline ring"])
def test_snapshot_restores_records_order_and_priorities(tmp_path, kind):
    from mpirl.replay import snapshot
    spec = _frames_spec() if "frames" in kind else SPEC
    make = (lambda: PrioritizedShard(spec, 50, alpha=0.6, dedup_frames="frames" in kind)) if "shard" in kind \
        else (lambda: RingStore({**spec, "priority": ((), np.float32)}, 50))
    rng = np.random.default_rng(4)
    memory = make()
    for start in (0, 30, 60):  # wraps: the oldest records are overwritten
        recs = _stream(start, 30) if "frames" in kind else make_records(start, 30)
        prio = rng.random(30).astype(np.float32)
        if "shard" in kind:
            memory.add(recs, prio)
        else:
            memory.add({**recs, "priority": prio})
    snapshot.save(tmp_path / "r.npz", snapshot.snapshot(memory), train_steps=123)
    arrays, meta = snapshot.load(tmp_path / "r.npz")
    assert meta == {"train_steps": 123}
    again = make()
    assert snapshot.restore(again, arrays) == 50
    ring, ring2 = (memory.store, again.store) if "shard" in kind else (memory, again)
    fields = {name: np.zeros((50, *shape), dtype) for name, (shape, dtype) in ring.spec.items()}
    fields2 = {name: np.zeros((50, *shape), dtype) for name, (shape, dtype) in ring.spec.items()}
    ring.export(fields)
    ring2.export(fields2)
    for name in fields:  # the same records, oldest first
        np.testing.assert_array_equal(fields[name], fields2[name])
    assert fields["reward"][0] == 40.0  # records 0..39 were overwritten
    if "shard" in kind:
        np.testing.assert_array_equal(memory.raw_priority[ring.oldest_first()],
                                      again.raw_priority[ring2.oldest_first()])
        assert again.total == pytest.approx(memory.total)
        if "frames" in kind:
            assert len(arrays["frames"]) < 50 * 8  # frames stayed once in the file
            assert ring2.pool.live == ring.pool.live
            with pytest.raises(ValueError, match="dedup_frames"):  # stacks stored whole cannot take it
                snapshot.restore(PrioritizedShard(spec, 50, alpha=0.6, dedup_frames=False), arrays)
