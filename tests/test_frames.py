"""Frames stored once: the pool, and ring stores / shards that keep frame indices."""

import numpy as np
import pytest

from mpirl.replay.batch_frames import distinct_frames
from mpirl.replay.frames import FramePool, framed_fields
from mpirl.replay.ring import RingStore
from mpirl.replay.shard import PrioritizedShard

STACK, H, W = 4, 84, 84
SPEC = {"obs": ((STACK, H, W), np.uint8), "action": ((), np.int64), "reward": ((), np.float32),
        "next_obs": ((STACK, H, W), np.uint8), "done": ((), np.bool_), "discount": ((), np.float32)}


def game_streams(n_streams, steps, n=3, seed=0):
    """Transitions as an Atari actor builds them: frame stacks over one frame sequence per
    game, obs = frames t-3..t, next_obs = frames t+n-3..t+n, games interleaved; the first
    stack of a game is padded with zero frames, as ale-py's reset does."""
    rng = np.random.default_rng(seed)
    games = [np.concatenate([np.zeros((STACK - 1, H, W), np.uint8),
                             rng.integers(0, 256, (steps + n, H, W), dtype=np.uint8)]) for _ in range(n_streams)]
    rows = []
    for t in range(steps):
        for g in games:
            rows.append((g[t:t + STACK], g[t + n:t + n + STACK]))
    obs = np.stack([r[0] for r in rows])
    nxt = np.stack([r[1] for r in rows])
    k = len(rows)
    return {"obs": obs, "action": rng.integers(0, 4, k), "reward": rng.random(k, dtype=np.float32),
            "next_obs": nxt, "done": rng.random(k) < 0.01, "discount": np.full(k, 0.97, np.float32)}


def chunks(records, size):
    k = len(records["action"])
    for s in range(0, k, size):
        yield {name: v[s:s + size] for name, v in records.items()}


def out_for(spec, k):
    return {name: np.zeros((k, *shape), dtype) for name, (shape, dtype) in spec.items()}


def test_pool_stores_equal_frames_once_and_frees_them():
    pool = FramePool((H, W), 16)
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 256, (2, H, W), dtype=np.uint8)
    idx = pool.intern(np.stack([a, b, a, a]))
    assert idx.tolist() == [0, 1, 0, 0] and pool.live == 2
    assert pool.refs[0] == 3 and pool.refs[1] == 1
    pool.release(np.array([0, 0, 1]))
    assert pool.live == 1 and pool.refs[0] == 1
    c = rng.integers(0, 256, (H, W), dtype=np.uint8)
    assert pool.intern(c[None]).tolist() == [1]  # the lowest free frame is reused
    np.testing.assert_array_equal(pool.frames[1], c)
    assert pool.high_water == 2


def test_fingerprint_collisions_never_alias_frames(monkeypatch):
    pool = FramePool((H, W), 8)
    monkeypatch.setattr(pool, "fingerprints", lambda frames: np.zeros(len(frames), np.uint64))
    rng = np.random.default_rng(2)
    frames = rng.integers(0, 256, (3, H, W), dtype=np.uint8)
    idx = pool.intern(frames)
    assert len(set(idx.tolist())) == 3
    for i, j in enumerate(idx):
        np.testing.assert_array_equal(pool.frames[j], frames[i])


def test_collision_with_a_pool_frame_stores_the_new_content_apart(monkeypatch):
    pool = FramePool((H, W), 8)
    monkeypatch.setattr(pool, "fingerprints", lambda frames: np.zeros(len(frames), np.uint64))
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 256, (2, H, W), dtype=np.uint8)
    ia = pool.intern(a[None])
    ib = pool.intern(np.stack([b, b]))  # one fingerprint, equal bytes inside the batch, differs from the pool's
    assert ib.tolist() == [ib[0]] * 2 and ib[0] != ia[0] and pool.refs[ib[0]] == 2
    np.testing.assert_array_equal(pool.frames[ib[0]], b)
    assert pool.intern(a[None]).tolist() == ia.tolist() and pool.refs[ia[0]] == 2


def test_interning_matches_a_reference_model():
    # Batches drawn from a few distinct contents with repeats inside and across batches;
    # the pool must hand out frames with the right bytes and count references exactly.
    rng = np.random.default_rng(4)
    contents = rng.integers(0, 256, (12, H, W), dtype=np.uint8)
    pool = FramePool((H, W), 64)
    held = []  # (frame index, content number) references still held
    for _ in range(200):
        pick = rng.integers(0, len(contents), rng.integers(1, 20))
        idx = pool.intern(contents[pick])
        for j, c in zip(idx.tolist(), pick.tolist()):
            np.testing.assert_array_equal(pool.frames[j], contents[c])
        held += list(zip(idx.tolist(), pick.tolist()))
        rng.shuffle(held)
        k = int(rng.integers(0, len(held) + 1))
        pool.release(np.array([j for j, _ in held[:k]], dtype=np.int64))
        held = held[k:]
        counts = np.bincount([j for j, _ in held], minlength=64)
        np.testing.assert_array_equal(pool.refs, counts)
        assert pool.live == len({c for _, c in held})  # each live content exactly once


def test_frames_given_in_a_wider_dtype_are_stored_as_uint8_and_shared():
    from mpirl.replay.ring import RingStore
    spec = {"obs": ((2, 3, 5), np.uint8), "action": ((), np.int64)}
    store = RingStore(spec, 4, dedup_frames=True)
    obs = np.arange(30).reshape(1, 2, 3, 5)  # int64 values of uint8 frames (15 bytes each)
    for _ in range(2):
        store.add({"obs": obs, "action": np.zeros(1, np.int64)})
    assert store.pool.live == 2  # the two distinct frames, once each across both records
    out = {"obs": np.zeros((2, 2, 3, 5), np.uint8), "action": np.zeros(2, np.int64)}
    store.gather(np.array([0, 1]), out)
    np.testing.assert_array_equal(out["obs"], np.concatenate([obs, obs]).astype(np.uint8))


def test_over_releasing_is_an_error():
    pool = FramePool((2, 2), 4)
    idx = pool.intern(np.ones((1, 2, 2), np.uint8))
    pool.release(idx)
    with pytest.raises(RuntimeError):
        pool.release(idx)


def test_framed_fields_are_the_uint8_stacks():
    assert set(framed_fields(SPEC)) == {"obs", "next_obs"}
    assert framed_fields({"obs": ((4,), np.float32)}) == {}


def test_deduplicated_store_returns_the_same_records_under_16_kb_per_slot():
    records = game_streams(n_streams=4, steps=700)  # 2,800 transitions through 2,048 slots: wraps
    plain, dedup = RingStore(SPEC, 2048), RingStore(SPEC, 2048, dedup_frames=True)
    for chunk in chunks(records, 64):
        np.testing.assert_array_equal(plain.add(chunk), dedup.add(chunk))
    assert dedup.size == plain.size == 2048
    ids = np.random.default_rng(3).integers(0, 2048, 512)
    a, b = out_for(SPEC, 512), out_for(SPEC, 512)
    plain.gather(ids, a)
    dedup.gather(ids, b)
    for name in SPEC:
        np.testing.assert_array_equal(a[name], b[name])
    # One new frame per transition, plus the shared zero frame: about 7 KB a slot, not 56 KB.
    assert dedup.pool.live <= 2048 + 4 * 8 + 1
    per_slot = dedup.nbytes / dedup.capacity
    assert per_slot <= 16_384, per_slot
    assert plain.nbytes / plain.capacity > 56_000


def test_overwriting_frees_frames_so_the_pool_does_not_grow():
    dedup = RingStore(SPEC, 256, dedup_frames=True)
    for chunk in chunks(game_streams(n_streams=2, steps=1000, seed=4), 32):
        dedup.add(chunk)
    assert dedup.pool.live <= 256 + 2 * 8 + 1
    assert dedup.pool.high_water <= 256 + 2 * 8 + 1 + 2 * 32 * 8  # at most one message's worth above
    refs = np.bincount(np.concatenate([i.reshape(-1) for i in dedup.frame_idx.values()]),
                       minlength=dedup.pool.max_frames)
    np.testing.assert_array_equal(refs, dedup.pool.refs)  # every reference counted, none leaked


def test_framed_export_round_trips_into_another_memory():
    records = game_streams(n_streams=3, steps=300, seed=5)
    src = RingStore({**SPEC, "priority": ((), np.float32)}, 500, dedup_frames=True)
    records["priority"] = np.random.default_rng(5).random(len(records["action"]), dtype=np.float32)
    for chunk in chunks(records, 50):
        src.add(chunk)
    plain_out = out_for(src.spec, 500)
    n = src.export(plain_out)
    dump = {name: np.zeros((500, *shape), dtype) for name, (shape, dtype) in src.spec.items() if name in src.fields}
    dump.update({f"{name}_idx": np.zeros((500, STACK), np.int32) for name in src.framed})
    frames = np.zeros((500 * 8, H, W), np.uint8)
    rows, n_frames = src.export_framed(dump, frames)
    assert rows == n == 500 and n_frames <= 500 + 3 * 8 + 1
    dst = PrioritizedShard(SPEC, 1000, alpha=0.6, dedup_frames=True)
    dst.add_framed({k: v[:rows] for k, v in dump.items() if k != "priority"}, frames[:n_frames], dump["priority"][:rows])
    got = out_for(SPEC, 500)
    dst.store.gather(np.arange(500), got)
    for name in SPEC:
        np.testing.assert_array_equal(got[name], plain_out[name][:500])
    np.testing.assert_allclose(dst.raw_priority[:500], plain_out["priority"][:500])
    assert dst.store.pool.live == n_frames


def test_real_atari_frames_dedup(tmp_path):
    import ale_py  # noqa: F401  (in the test extra: a missing one fails)
    from mpirl.config import EnvConfig
    from mpirl.envs.vector import make_vector
    from mpirl.replay.nstep import NStepAccumulator
    envs = make_vector(EnvConfig(id="ALE/Breakout-v5", envs_per_actor=2), seed=0)
    obs = envs.reset()
    acc = [NStepAccumulator(3, 0.99) for _ in range(2)]
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(600):
        step = envs.step(envs.forced(rng.integers(0, envs.n_actions, 2)))
        for k in range(2):
            rows += acc[k].push(obs[k], 0, step.reward[k], step.final_obs[k],
                                step.terminated[k] | step.life_lost[k], step.truncated[k])
        obs = step.obs
    envs.close()
    records = {"obs": np.stack([r[0] for r in rows]), "action": np.zeros(len(rows), np.int64),
               "reward": np.array([r[2] for r in rows], np.float32), "next_obs": np.stack([r[3] for r in rows]),
               "done": np.array([r[4] for r in rows]), "discount": np.array([r[5] for r in rows], np.float32)}
    store = RingStore(SPEC, 1024, dedup_frames=True)
    for chunk in chunks(records, 32):
        store.add(chunk)
    assert store.nbytes / store.capacity <= 16_384
    out = out_for(SPEC, store.size)
    store.gather(np.arange(store.size), out)
    ref = RingStore(SPEC, 1024)
    for chunk in chunks(records, 32):
        ref.add(chunk)
    want = out_for(SPEC, ref.size)
    ref.gather(np.arange(ref.size), want)
    for name in SPEC:
        np.testing.assert_array_equal(out[name], want[name])


@pytest.mark.parametrize("max_frames", [1, 5, 4096, 600_000, 1 << 25])
def test_distinct_frames_are_ascending_and_index_every_entry(max_frames):
    """A batch's distinct frames (a radix sort of its (frame, entry) pairs: one pass for small pools, three for
    2^25 frames) are numpy's unique frames, and each entry's position among them its inverse; repeated slots,
    repeated frames within a slot and an empty batch included."""
    rng = np.random.default_rng(max_frames)
    cols = rng.integers(0, max_frames, (300, 8)).astype(np.int32)
    cols[3] = max_frames - 1
    cols[4] = cols[4, 0]  # one frame in every column
    for slots in (rng.integers(0, 300, 512), np.array([3, 4, 4, 3]), np.arange(300), np.zeros(0, np.int64)):
        uniq, local = distinct_frames(cols, slots, max_frames)
        want, inverse = np.unique(cols[slots], return_inverse=True)
        np.testing.assert_array_equal(uniq, want)
        np.testing.assert_array_equal(local, inverse.reshape(len(slots), 8))
        assert uniq.dtype == np.int64 and local.dtype == np.int32 and local.shape == (len(slots), 8)
