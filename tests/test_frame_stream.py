"""Frames once on the wire: an actor's messages carry each frame once, the buffer stores without looking for
duplicates, replies carry a batch's distinct frames, and every stack comes back as the environment made it."""

import functools
from collections import deque
from pathlib import Path

import ale_py  # noqa: F401  (in the test extra: a missing one fails)
import numpy as np
import pytest
import torch

from mpirl import config
from mpirl.agents.dqn import transition_spec
from mpirl.agents.exploration import env_epsilons
from mpirl.agents.tensors import to_tensors
from mpirl.algos.apex.algorithm import Spaces
from mpirl.algos.apex.serving import ApexDeciding, ApexGames
from mpirl.comm.messages import sample_layout
from mpirl.replay import snapshot
from mpirl.replay.frame_stream import FrameStream, FrameWindows, window_frames
from mpirl.replay.frames import framed_fields
from mpirl.replay.ring import RingStore
from mpirl.replay.shard import PrioritizedShard
from mpirl.actor_learner.actor import Acting
from mpirl.actor_learner.experience import ExperiencePacker, store_experience

JOBS = Path(__file__).resolve().parents[1] / "jobs"
SPEC = transition_spec((4, 84, 84), np.uint8)


def breakout(dedup: bool, **over):
    sets = {"env.envs_per_actor": 2, "env.max_episode_steps": 40, "env.terminal_on_life_loss": True,
            "apex.n_step": 3, "comm.send_batch": 8, "replay.dedup_frames": dedup, **over}
    cfg, _ = config.load(JOBS / "breakout_proposed_small.toml", [f"{k}={str(v).lower()}" for k, v in sets.items()])
    return cfg


def actor(cfg, params=None, seed=5):
    spec = transition_spec((4, 84, 84), np.uint8)
    spaces = Spaces((4, 84, 84), np.dtype(np.uint8), 4)
    a = Acting(ApexGames(cfg, spaces, seed, "actor 0"), ApexDeciding(cfg, spaces, spec, [seed], [0], 1))
    np.testing.assert_array_equal(a.deciding.epsilons[0], env_epsilons(0, 1, cfg.env.envs_per_actor, 0.4, 7.0))
    if params is None:
        params = (np.random.default_rng(0).standard_normal(a.policy.n_params) * 0.05).astype(np.float32)
    a.policy.load_flat(params)
    a.start()
    return a, spec, params


@functools.lru_cache(maxsize=None)
def run_stacks(steps):
    """Every transition an actor with frame stacks stages, in order, with its initial priority (the same actor,
    so played once per module and length: the tests below use two lengths; the records are read-only)."""
    a, spec, params = actor(breakout(False))
    rows, prios = [], []
    for _ in range(steps):
        a.step()
        if a.staged:
            records, p = a.take(a.staged)
            rows.append({k: v.copy() for k, v in records.items()})
            prios.append(p)
            a.drop(a.staged)
    a.close()
    out = ({k: np.concatenate([r[k] for r in rows]) for k in rows[0]}, np.concatenate(prios), params)
    for array in (*out[0].values(), out[1]):  # the records; the weights go into networks as they are
        array.flags.writeable = False
    return out


def run_streamed(steps, store, windows, framed, params, sender=1, **over):
    """The same actor with frames once: its messages, packed as it sends them, stored as a buffer stores them."""
    cfg = breakout(True, **over)
    a, spec, _ = actor(cfg, params)
    packer = ExperiencePacker(spec, cfg.comm.send_batch, sender, a.frames, a.framed)
    buf = packer.layout.buffer()
    sizes = []

    def send(rows, final=False):
        records, p = a.take(rows)
        sizes.append(packer.pack(buf, records, p, a.episodes, final, oldest=a.oldest_frame(rows)))
        a.drop(rows)
        store_experience(store, packer.layout, buf, True, windows, framed)

    for _ in range(steps):
        a.step()
        while a.staged >= cfg.comm.send_batch:
            send(cfg.comm.send_batch)
        if packer.frames_due:
            send(min(a.staged, cfg.comm.send_batch))
    send(a.staged, final=True)
    a.close()
    return sizes


def stored(shard, n=None):
    """The shard's records oldest first, frame stacks rebuilt."""
    ring = shard.store
    ids = ring.oldest_first()[-(n or ring.size):]
    out = {name: np.zeros((len(ids), *shape), dtype) for name, (shape, dtype) in ring.spec.items()}
    ring.gather(ids, out)
    return out, shard.raw_priority[ids]


def shard_for(spec, capacity, cfg):
    framed = framed_fields(spec)
    extra = window_frames(cfg.comm.send_batch, cfg.env.envs_per_actor, cfg.apex.n_step, framed)
    shard = PrioritizedShard(spec, capacity, alpha=0.6, dedup_frames=True, stream_frames=extra)
    return shard, FrameWindows(shard.store.pool), framed


def streamed(steps, capacity):
    """The actor's transitions as stacks, and a shard that stored the same actor's frames-once messages."""
    want, want_p, params = run_stacks(steps)
    cfg = breakout(True)
    shard, windows, framed = shard_for(SPEC, capacity, cfg)
    sizes = run_streamed(steps, shard, windows, framed, params)
    return want, want_p, params, shard, windows, sizes


def test_every_stored_stack_is_the_stack_the_environment_made():
    """Same seed and weights: the actor with stacks and the actor with frames once stage the same transitions;
    stored from messages (autoresets, life losses, time limits, n-step windows across messages), every
    field of every record is equal, and so is every priority."""
    want, want_p, _, shard, windows, sizes = streamed(300, 4096)
    spec = SPEC
    got, got_p = stored(shard)
    n = len(want["action"])
    assert n > 400 and shard.size == n
    assert want["done"].any() and (want["discount"] > 0.99 ** 3 + 1e-6).any()  # ends and cut windows were seen
    for name in spec:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    np.testing.assert_allclose(got_p, np.abs(want_p), rtol=1e-5, atol=1e-6)
    # Each frame crossed once: about one 7 KB frame a transition, against 56 KB a transition as stacks.
    assert sum(sizes) < n * 84 * 84 * 1.6
    assert windows.held == 0  # the final message closed the window
    # Every frame the pool holds is referred to by a slot, as often as its count says.
    ring = shard.store
    used = np.concatenate([idx[:ring.size].reshape(-1) for idx in ring.frame_idx.values()])
    np.testing.assert_array_equal(np.bincount(used, minlength=ring.pool.max_frames), ring.pool.refs)


def test_overwritten_slots_free_their_frames_and_windows_hold_only_what_is_live():
    want, _, _, shard, _, _ = streamed(300, 64)
    got, _ = stored(shard)
    for name in SPEC:
        np.testing.assert_array_equal(got[name], {k: v[-64:] for k, v in want.items()}[name], err_msg=name)
    pool = shard.store.pool
    assert pool.live <= 64 * 8 and pool.high_water < 64 * 8 + window_frames(8, 2, 3, framed_fields(SPEC))


def test_a_restored_snapshot_and_a_resumed_actor_stay_exact():
    """A snapshot's memory restored into a new shard, then a new actor process (its frame ids from 0 again)."""
    want, _, params, shard, _, _ = streamed(150, 4096)
    arrays = snapshot.snapshot(shard)
    restored, windows2, framed = shard_for(SPEC, 4096, breakout(True))
    assert snapshot.restore(restored, arrays) == len(want["action"])
    run_streamed(150, restored, windows2, framed, params)  # the resumed job's actor: same games again
    got, _ = stored(restored)
    for name in SPEC:
        np.testing.assert_array_equal(got[name], np.concatenate([want[name], want[name]]), err_msg=name)


def test_a_sample_reply_carries_each_frame_once_and_the_learner_rebuilds_the_stacks():
    _, _, _, shard, _, _ = streamed(150, 4096)
    spec, framed = SPEC, framed_fields(SPEC)
    k = 64
    lay = sample_layout(spec, k, framed)
    buf = lay.buffer()
    views = lay.views(buf, k, frames=lay.counted["frames"][2])
    s = shard.sample_into(k, np.random.default_rng(3), views)
    lay.set(buf, rows=k, frames_rows=s.frames)
    got = lay.views(buf)  # as the learner reads it
    assert len(got["frames"]) == s.frames < k * 8 and lay.nbytes(k, frames=s.frames) < k * 8 * 84 * 84
    stacks = {name: np.zeros((k, *shape), dtype) for name, (shape, dtype) in spec.items()}
    shard.store.gather(s.ids, stacks)
    batch = to_tensors({name: got[name] for name in [*lay.fields, "frames"]
                        if name not in ("ids", "versions", "probs", "priority")}, torch.device("cpu"))
    for name in spec:
        np.testing.assert_array_equal(batch[name].numpy(), stacks[name], err_msg=name)


def test_a_reply_holds_each_frame_once_in_pool_order_also_for_repeated_slots():
    _, _, _, shard, _, _ = streamed(150, 4096)
    store = shard.store
    ids = np.random.default_rng(5).integers(0, store.size, 300)
    ids[:40] = ids[40:80]  # a slot drawn twice
    width = store.frame_cols.shape[1]
    out = {name: np.zeros((len(ids), *shape), dtype) for name, (shape, dtype) in store.spec.items()
           if name not in store.framed}
    out.update({f"{name}_idx": np.zeros((len(ids), depth), np.int32) for name, (depth, _) in store.framed.items()})
    frames = np.zeros((len(ids) * width, 84, 84), np.uint8)
    for _ in range(2):  # a second call finds the same frames (nothing left over from the first)
        n = store.gather_framed(ids, out, frames)
        used = store.frame_cols[ids]
        assert n == len(np.unique(used))
        local = np.concatenate([out[f"{name}_idx"] for name in store.framed], axis=1)
        np.testing.assert_array_equal(np.unique(used)[local], used)  # ascending pool order, each frame once
        np.testing.assert_array_equal(frames[:n][local], store.pool.frames[used])


def test_the_frame_stream_grows_its_ring_and_keeps_live_frames():
    rng = np.random.default_rng(0)
    stream = FrameStream(games=1, depth=4, frame_shape=(2, 2), ring=4)
    made = {}
    stack = rng.integers(0, 255, (4, 2, 2), dtype=np.uint8)
    ids = stream.start(0, stack)
    made.update(zip(ids.tolist(), stack))
    for _ in range(50):  # nothing sent: every frame stays live, the ring grows
        stack = np.concatenate([stack[1:], rng.integers(0, 255, (1, 2, 2), dtype=np.uint8)])
        ids = stream.advance(0, stack)
        made[int(ids[-1])] = stack[-1]
    out, games = np.zeros((stream.pending, 2, 2), np.uint8), np.zeros(stream.pending, np.int32)
    assert stream.copy_pending(out, games) == 0 and len(out) == 54 and not games.any()
    np.testing.assert_array_equal(out, np.stack([made[i] for i in range(54)]))
    pool_windows = FrameWindows(__import__("mpirl.replay.frames", fromlist=["FramePool"]).FramePool((2, 2), 100))
    pool_windows.receive(1, 0, out)
    stream.sent_upto(stream.oldest())
    pool_windows.forget(1, stream.oldest())
    assert pool_windows.held == 4 and pool_windows.pool.live == 4  # only the current stack's frames
    with pytest.raises(RuntimeError, match="outside its window"):
        pool_windows.lookup(1, np.array([3]))
    with pytest.raises(RuntimeError, match="expected 54"):
        pool_windows.receive(1, 60, out[:1])


def test_a_games_frames_go_into_the_pool_side_by_side():
    """Frames arrive interleaved by game (one per game a step); each game's land in neighbouring frames of
    the pool, in order, so a transition's stacks are one run of memory."""
    from mpirl.replay.frames import FramePool
    windows = FrameWindows(FramePool((2, 2), 64))
    frames = np.arange(24, dtype=np.uint8).repeat(4).reshape(24, 2, 2)
    windows.receive(7, 0, frames, np.tile(np.arange(3), 8))  # ids 0..23, game = id % 3
    idx = windows.lookup(7, np.arange(24))
    np.testing.assert_array_equal(windows.pool.frames[idx], frames)  # every id finds its own frame
    for g in range(3):
        np.testing.assert_array_equal(np.diff(idx[g::3]), 1)


def test_a_baseline_relay_stores_messages_with_their_priorities_as_a_field():
    steps = 150
    want, want_p, params = run_stacks(steps)
    cfg = breakout(True)
    spec = transition_spec((4, 84, 84), np.uint8)
    framed = framed_fields(spec)
    relay = RingStore({**spec, "priority": ((), np.float32)}, 4096, dedup_frames=True,
                      stream_frames=window_frames(8, 2, 3, framed))
    windows = FrameWindows(relay.pool)
    a, _, _ = actor(cfg, params)
    packer = ExperiencePacker(spec, 8, 1, a.frames, a.framed)
    buf = packer.layout.buffer()
    for _ in range(steps):
        a.step()
        while a.staged >= 8:
            records, p = a.take(8)
            packer.pack(buf, records, p, deque(), oldest=a.oldest_frame(8))
            a.drop(8)
            store_experience(relay, packer.layout, buf, False, windows, framed)
    a.close()
    out = {name: np.zeros((relay.size, *shape), dtype) for name, (shape, dtype) in relay.spec.items()}
    n = relay.export(out)
    for name in spec:
        np.testing.assert_array_equal(out[name], want[name][:n], err_msg=name)
    np.testing.assert_allclose(out["priority"], want_p[:n], rtol=1e-5, atol=1e-6)


def test_an_inference_worker_streams_the_frames_of_the_actors_it_serves():
    """DMCAF: the worker numbers the frames of its actors' games (one stream for all) and stages what the actor
    alone stages; stacks rebuilt from its frame ids equal the stacks the actor alone made."""
    from mpirl.algos.apex.serving import ApexDeciding, ApexGames
    from mpirl.algos.apex.algorithm import Spaces
    steps = 150
    want, want_p, params = run_stacks(steps)
    cfg = breakout(True)
    spaces = Spaces((4, 84, 84), np.dtype(np.uint8), 4)
    spec = transition_spec((4, 84, 84), np.uint8)
    worker = ApexDeciding(cfg, spaces, spec, [5], [0], 1)
    worker.policy.load_flat(params)
    games = ApexGames(cfg, spaces, 5, "actor 0")
    outcome = games.start()
    worker.observe(0, outcome)
    got, prios = [], []
    for _ in range(steps):
        outcome = games.step(worker.decide([0], [outcome]))
        worker.observe(0, outcome)
        if worker.staging.count:
            records, p = worker.take(worker.staging.count)
            got.append({k: v.numpy().copy() for k, v in to_tensors(worker.frames.batch(records, worker.framed),
                                                                    torch.device("cpu")).items()})
            prios.append(p)
            worker.drop(worker.staging.count)
    games.close()
    for name in spec:
        np.testing.assert_array_equal(np.concatenate([g[name] for g in got]), want[name], err_msg=name)
    np.testing.assert_allclose(np.concatenate(prios), want_p, rtol=1e-5, atol=1e-6)


def test_shares_of_several_buffers_join_into_one_batch_of_the_right_stacks():
    """R buffers, each a reply with its own frames: joined, every index points past the shares before it."""
    from mpirl.actor_learner.shard_links import joined
    rng = np.random.default_rng(2)
    views, want = [], []
    for rows, nframes in ((3, 5), (4, 2), (2, 6)):
        frames = rng.integers(0, 255, (nframes, 84, 84), dtype=np.uint8)
        idx = {n: rng.integers(0, nframes, (rows, 4)).astype(np.int32) for n in ("obs_idx", "next_obs_idx")}
        views.append({"action": rng.integers(0, 4, rows), "frames": frames, **idx})
        want.append({n[:-4]: frames[i] for n, i in idx.items()})
    batch = to_tensors(joined(views, ["action", "obs_idx", "next_obs_idx", "frames"]), torch.device("cpu"))
    for name in ("obs", "next_obs"):
        np.testing.assert_array_equal(batch[name].numpy(), np.concatenate([w[name] for w in want]))
    np.testing.assert_array_equal(batch["action"].numpy(), np.concatenate([v["action"] for v in views]))
