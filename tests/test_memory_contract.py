"""The replay memory contract (:mod:`mpirl.replay.memory`), checked the same way over every memory and sampler:
transitions (prioritized, uniform), Atari transitions with frames stored once (prioritized), MinAtar's boolean
planes (prioritized: bool stays bool, never taken for frames), whole episodes (uniform, AccMER, prioritized).
Each case is built from the real store and sampler."""

from __future__ import annotations

import numpy as np
import pytest

from mpirl.comm.messages import sample_layout
from mpirl.replay import snapshot
from mpirl.replay.episodes import EpisodeStore
from mpirl.replay.memory import ReplayMemory
from mpirl.replay.prioritized import PrioritizedSampler
from mpirl.replay.ring import RingStore
from mpirl.replay.samplers import AccMERSampler, UniformSampler
from mpirl.replay.weights import importance_weights

CAP, K = 32, 8
T = 5
TRANSITION = {"obs": ((4,), np.dtype(np.float32)), "action": ((), np.dtype(np.int64)),
              "reward": ((), np.dtype(np.float32)), "next_obs": ((4,), np.dtype(np.float32)),
              "done": ((), np.dtype(np.bool_))}
ATARI = {"obs": ((4, 6, 6), np.dtype(np.uint8)), "action": ((), np.dtype(np.int64)),
         "reward": ((), np.dtype(np.float32)), "next_obs": ((4, 6, 6), np.dtype(np.uint8)),
         "done": ((), np.dtype(np.bool_))}
MINATAR = {"obs": ((4, 10, 10), np.dtype(np.bool_)), "action": ((), np.dtype(np.int64)),
           "reward": ((), np.dtype(np.float32)), "next_obs": ((4, 10, 10), np.dtype(np.bool_)),
           "done": ((), np.dtype(np.bool_))}
EPISODE = {"obs": ((T + 1, 2, 3), np.dtype(np.uint8)), "actions": ((T + 1, 2), np.dtype(np.int64)),
           "reward": ((T + 1,), np.dtype(np.float32)), "filled": ((T + 1,), np.dtype(np.bool_))}


def transitions(numbers: np.ndarray, spec: dict) -> dict:
    """Records whose every field carries the record's number (Atari: frame stacks sharing frames as an
    actor's do, frame t is t in every pixel; next_obs is three steps on)."""
    n = len(numbers)
    out = {"action": numbers.astype(np.int64), "reward": numbers.astype(np.float32), "done": numbers % 7 == 0}
    if spec is ATARI:
        def stack(t: np.ndarray) -> np.ndarray:
            frames = ((t[:, None] + np.arange(4)) % 256).astype(np.uint8)
            return np.broadcast_to(frames[:, :, None, None], (n, 4, 6, 6)).copy()

        out["obs"], out["next_obs"] = stack(numbers), stack(numbers + 3)
    elif spec is MINATAR:  # boolean planes (MinAtar): cell (c, y, x) is bit (c + y + x) % 16 of the number
        def planes(t: np.ndarray) -> np.ndarray:
            bit = (np.arange(4)[:, None, None] + np.arange(10)[:, None] + np.arange(10)) % 16
            return ((t[:, None, None, None] >> bit) & 1).astype(bool)

        out["obs"], out["next_obs"] = planes(numbers), planes(numbers + 1)
    else:
        out["obs"] = np.repeat(numbers[:, None], 4, axis=1).astype(np.float32)
        out["next_obs"] = out["obs"] + 1
    return out


def episodes(numbers: np.ndarray, spec: dict) -> dict:
    """Whole episodes of lengths 2..T, every filled row carrying the episode's number."""
    out = {name: np.zeros((len(numbers), *shape), dtype) for name, (shape, dtype) in spec.items()}
    for i, num in enumerate(numbers.tolist()):
        length = 2 + num % (T - 1)
        out["obs"][i, :length + 1] = num % 256
        out["actions"][i, :length] = num
        out["reward"][i, :length] = num
        out["filled"][i, :length] = True
    return out


def prioritized_ring(spec, dedup=False):
    store = RingStore(spec, CAP, dedup_frames=dedup)
    return ReplayMemory(store, PrioritizedSampler(CAP, alpha=0.6, eps=1e-3, versions=store.versions))


def prioritized_episodes(spec):
    store = EpisodeStore(spec, CAP)
    return ReplayMemory(store, PrioritizedSampler(CAP, alpha=0.6, eps=1e-3, versions=store.versions))


# name: (make the memory, its spec, make records, weighted: priorities set sampling, keeps inserted priorities)
CASES = {
    "transitions prioritized": (lambda: prioritized_ring(TRANSITION), TRANSITION, transitions, True, True),
    "transitions uniform": (lambda: ReplayMemory(RingStore(TRANSITION, CAP), UniformSampler(CAP)), TRANSITION,
                            transitions, False, False),
    "atari frames once prioritized": (lambda: prioritized_ring(ATARI, dedup=True), ATARI, transitions, True, True),
    "boolean planes prioritized": (lambda: prioritized_ring(MINATAR, dedup=True), MINATAR, transitions, True, True),
    "episodes uniform": (lambda: ReplayMemory(EpisodeStore(EPISODE, CAP), UniformSampler(CAP)), EPISODE, episodes,
                         False, False),
    "episodes accmer": (lambda: ReplayMemory(EpisodeStore(EPISODE, CAP), AccMERSampler(CAP, K, 0.5, 0.8)), EPISODE,
                        episodes, True, False),
    "episodes prioritized": (lambda: prioritized_episodes(EPISODE), EPISODE, episodes, True, True),
}


@pytest.fixture(params=list(CASES))
def case(request):
    make, spec, records, weighted, keeps = CASES[request.param]
    return make, spec, records, weighted, keeps


def fill(memory, records, spec, first: int, n: int, rng) -> tuple[dict, np.ndarray]:
    """Add records ``first .. first + n - 1`` with random priorities; returns (slot -> number, priorities)."""
    numbers = np.arange(first, first + n)
    prio = (rng.random(n) + 0.1).astype(np.float32)
    ids = memory.add(records(numbers, spec), prio)
    return dict(zip(ids.tolist(), numbers[n - len(ids):].tolist())), prio[n - len(ids):]


def reply(memory, spec, k=K):
    lay = sample_layout(spec, k, memory.framed)
    counted = {"frames": lay.counted["frames"][2]} if lay.counted else {}
    return lay.views(lay.buffer(), k, **counted)


def records_of(memory, out, k) -> dict:
    """The sampled records from a reply's views (frame stacks rebuilt from the frames sent once)."""
    got = {name: out[name][:k] for name in memory.store.spec if name not in memory.framed}
    for name in memory.framed:
        got[name] = out["frames"][out[f"{name}_idx"][:k]]
    return got


def test_add_then_size_and_total(case):
    make, spec, records, weighted, keeps = case
    memory, rng = make(), np.random.default_rng(0)
    assert memory.size == 0
    _, prio = fill(memory, records, spec, 0, 20, rng)
    assert memory.size == 20
    _, prio2 = fill(memory, records, spec, 20, 20, rng)  # wraps: 8 of the first are overwritten
    assert memory.size == CAP
    if keeps:
        live = np.concatenate([prio[8:], prio2])
        assert memory.total == pytest.approx(float(np.sum((live.astype(np.float64) + 1e-3) ** 0.6)))
    elif weighted:  # AccMER: every episode at the initial weight
        assert memory.total == pytest.approx(CAP * 1.0)
    else:
        assert memory.total == CAP


def test_sampled_items_were_added_with_their_shapes_and_dtypes(case):
    make, spec, records, weighted, keeps = case
    memory, rng = make(), np.random.default_rng(1)
    added, _ = fill(memory, records, spec, 0, 20, rng)
    more, _ = fill(memory, records, spec, 20, 20, rng)
    added.update(more)
    for _ in range(6):
        out = reply(memory, spec)
        s = memory.sample_into(K, rng, out)
        assert s.ids.dtype == np.int64 and s.versions.dtype == np.int64 and s.ids.shape == s.versions.shape == (K,)
        assert s.probs.dtype == np.float64 and s.priorities.dtype == np.float32
        assert ((s.probs > 0) & (s.probs <= 1)).all()
        np.testing.assert_array_equal(out["ids"][:K], s.ids)
        np.testing.assert_array_equal(out["versions"][:K], memory.versions[s.ids])
        got = records_of(memory, out, K)
        want = records(np.array([added[i] for i in s.ids.tolist()]), spec)
        for name, (shape, dtype) in spec.items():
            assert got[name].shape == (K, *shape) and got[name].dtype == dtype, name
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        memory.update_priorities(s.ids, s.versions, rng.random(K) + 0.1)


def test_importance_weights_are_in_0_1_with_max_1(case):
    make, spec, records, weighted, keeps = case
    memory, rng = make(), np.random.default_rng(2)
    fill(memory, records, spec, 0, CAP, rng)
    s = memory.sample(K, rng)
    w = importance_weights(s.probs, memory.size, beta=0.4)
    assert w.dtype == np.float32 and ((w > 0) & (w <= 1)).all() and w.max() == 1.0
    if keeps:  # distinct priorities: distinct probabilities, so not every weight is 1
        assert len(set(s.ids.tolist())) > 1 and w.min() < 1.0


def test_update_priorities_changes_how_often_a_slot_is_sampled(case):
    make, spec, records, weighted, keeps = case
    memory, rng = make(), np.random.default_rng(3)
    memory.add(records(np.arange(CAP), spec), np.ones(CAP, np.float32))
    counts = np.zeros(CAP)

    def draw(times: int) -> np.ndarray:
        counts.fill(0)
        for _ in range(times):
            np.add.at(counts, memory.sample(K, rng).ids, 1)
        return counts / counts.sum()

    before = draw(200)
    hot = np.argsort(before, kind="stable")[:4]  # four of the least drawn slots
    ids = np.arange(CAP)
    values = np.where(np.isin(ids, hot), 50.0, 0.01)
    assert memory.update_priorities(ids, memory.versions[ids], values) == 0
    after = draw(200)[hot].sum()
    if weighted:  # about 4/32 of the draws before (fewer: the least drawn), most of them after
        assert before[hot].sum() < 0.2 and after > 0.45
    else:  # uniform: the values are not kept
        assert abs(after - 4 / CAP) < 0.05


def test_a_slot_overwritten_after_it_was_sampled_keeps_its_new_priority(case):
    make, spec, records, weighted, keeps = case
    memory, rng = make(), np.random.default_rng(4)
    fill(memory, records, spec, 0, CAP, rng)
    s = memory.sample(K, rng)
    fill(memory, records, spec, CAP, CAP, rng)  # every slot refilled while the values were in flight
    before = memory.raw_priority.copy()
    stale = memory.update_priorities(s.ids, s.versions, np.full(K, 1e3))
    if weighted:
        assert stale == K
    np.testing.assert_allclose(memory.raw_priority[s.ids], before[s.ids] * (0.8 if isinstance(
        memory.sampler, AccMERSampler) else 1.0), rtol=1e-6)  # AccMER decays the table once per update
    assert (memory.raw_priority < 1e3).all()


def test_export_and_restore_round_trip(case, tmp_path):
    make, spec, records, weighted, keeps = case
    memory, rng = make(), np.random.default_rng(5)
    fill(memory, records, spec, 0, 20, rng)
    fill(memory, records, spec, 20, 20, rng)
    snapshot.save(tmp_path / "r.npz", snapshot.snapshot(memory), train_steps=7)
    arrays, meta = snapshot.load(tmp_path / "r.npz")
    again = make()
    assert snapshot.restore(again, arrays) == CAP == again.size and meta == {"train_steps": 7}
    a = {name: np.zeros((CAP, *shape), dtype) for name, (shape, dtype) in spec.items()}
    b = {name: np.zeros((CAP, *shape), dtype) for name, (shape, dtype) in spec.items()}
    pa, pb = np.zeros(CAP, np.float32), np.zeros(CAP, np.float32)
    assert memory.export(a, pa) == again.export(b, pb) == CAP
    for name in spec:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert a["reward"].reshape(CAP, -1)[:, 0].tolist() == list(range(8, 40))  # oldest first
    if keeps:
        np.testing.assert_array_equal(pa, pb)
        assert again.total == pytest.approx(memory.total)


def test_nbytes_is_the_store_the_sampler_and_the_cache(case):
    make, spec, records, weighted, keeps = case
    memory, rng = make(), np.random.default_rng(6)
    fill(memory, records, spec, 0, CAP, rng)
    memory.sample_into(K, rng, reply(memory, spec))  # AccMER gathers its reuse cache here
    cache = sum(a.nbytes for a in memory.cache.values()) if memory.cache else 0
    assert memory.nbytes == memory.store.nbytes + memory.sampler.nbytes + cache
    assert memory.sampler.nbytes >= CAP * 4  # a value (or a version) per slot
    plain = sum(a.nbytes for name, a in memory.store.fields.items())
    assert memory.store.nbytes >= plain + memory.versions.nbytes
    if memory.framed:  # frames once: far below the stacks stored whole
        assert memory.store.nbytes < CAP * sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in spec.values())


def test_boolean_planes_are_records_not_frames_to_store_once():
    assert prioritized_ring(MINATAR, dedup=True).framed == {}
    assert set(prioritized_ring(ATARI, dedup=True).framed) == {"obs", "next_obs"}
