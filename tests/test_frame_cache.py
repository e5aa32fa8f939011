"""The learner's frame cache: a reply carries only the frames the learner does not hold, and every stack the learner
rebuilds is the stack the buffer stored, across slot overwrites and pool index reuse, prefetched replies, several
buffers and a cache much smaller than the pool (slots shared by many frames)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpirl.agents.tensors import to_tensors
from mpirl.comm.messages import sample_layout
from mpirl.replay.frame_cache import CacheMirror, FrameCache, settle_slots
from mpirl.replay.frames import framed_fields
from mpirl.replay.shard import PrioritizedShard
from mpirl.actor_learner.shard_links import batch_fields

FRAME = (6, 6)
SPEC = {"obs": ((4, *FRAME), np.uint8), "next_obs": ((4, *FRAME), np.uint8), "action": ((), np.int64),
        "reward": ((), np.float32)}


class Game:
    """A stream of frames, few distinct (values 0-2 on 36 pixels: repeats across games happen): each record's stacks
    are 4 consecutive frames and the 4 after the next one, as an Atari game's are."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.frames = [self._frame() for _ in range(5)]

    def _frame(self) -> np.ndarray:
        return self.rng.integers(0, 3, FRAME, dtype=np.uint8)

    def records(self, n: int) -> dict[str, np.ndarray]:
        obs, nxt = [], []
        for _ in range(n):
            self.frames.append(self._frame())
            obs.append(np.stack(self.frames[-5:-1]))
            nxt.append(np.stack(self.frames[-4:]))
        return {"obs": np.stack(obs), "next_obs": np.stack(nxt), "action": self.rng.integers(0, 4, n),
                "reward": self.rng.standard_normal(n).astype(np.float32)}


def run(buffers: int, slots: int, capacity: int, rounds: int, prefetch: int, share: int = 16, seed: int = 0):
    """Replies built ``prefetch + 1`` ahead of the learner (as a job's are); each batch rebuilt from the cache and
    compared with the stacks the shards hold. Returns (hits, misses, distinct frames of the batches)."""
    rng = np.random.default_rng(seed)
    framed = framed_fields(SPEC)
    lay = sample_layout(SPEC, share, framed, cache=True)
    most = lay.counted["frames"][2]
    names = batch_fields(lay)
    shards = [PrioritizedShard(SPEC, capacity, alpha=0.6, dedup_frames=True) for _ in range(buffers)]
    games = [Game(np.random.default_rng(seed + 10 + b)) for b in range(buffers)]
    mirrors = [CacheMirror(slots) for _ in range(buffers)]
    cache = FrameCache(buffers, slots, most * buffers, FRAME, "cpu")
    in_flight: list[tuple[list, list]] = []  # per batch: each buffer's reply views, and the stacks they must give
    distinct = 0
    for r in range(rounds + prefetch + 1):
        if r < rounds:
            batch_views, want = [], []
            for b in range(buffers):
                recs = games[b].records(int(rng.integers(1, 9)))  # overwrites slots once the shard is full
                shards[b].add(recs, rng.random(len(recs["action"])))
                buf = lay.buffer()
                v = lay.views(buf, share, frames=most, frame_slots=most)
                s = shards[b].sample_into(share, rng, v, mirrors[b])
                settle_slots(lay, buf, share, s.frames)  # as the shard server does
                lay.set(buf, rows=share, frames_rows=s.frames, frame_slots_rows=s.frames)
                out = {name: np.zeros((share, *shape), dtype) for name, (shape, dtype) in SPEC.items()}
                shards[b].store.gather(s.ids, out)
                distinct += len(np.unique(shards[b].store.frame_cols[s.ids]))
                batch_views.append(lay.views(buf))
                want.append(out)
            in_flight.append((batch_views, want))
        if r >= prefetch and in_flight:  # the learner takes the oldest batch
            views, want = in_flight.pop(0)
            got = to_tensors(cache.join(views, names), torch.device("cpu"))
            for name in SPEC:
                np.testing.assert_array_equal(got[name].numpy(), np.concatenate([w[name] for w in want]), err_msg=name)
    return int(cache.hits.sum()), int(cache.misses.sum()), distinct


@pytest.mark.parametrize("buffers, slots, capacity, prefetch", [
    (1, 4096, 64, 0),     # a cache larger than the pool: only the frames new since they were last sampled travel
    (1, 7, 64, 2),        # 7 slots for ~300 live frames: most slots are claimed again and again
    (2, 97, 40, 1),       # two buffers, each its own part of the table
    (3, 1, 16, 2),        # one slot per buffer
])
def test_every_rebuilt_stack_is_the_stored_one(buffers, slots, capacity, prefetch):
    hits, misses, distinct = run(buffers, slots, capacity, rounds=150, prefetch=prefetch)
    assert hits + misses == distinct  # every distinct frame of every batch: held or sent, never both
    assert hits > 0 and misses > 0  # both paths taken (with one slot a buffer: 369 hits of 8,714 here)


def test_a_cache_that_holds_the_pool_sends_each_frame_about_once():
    hits, misses, distinct = run(1, 4096, 64, rounds=200, prefetch=2)
    assert hits > 0.8 * distinct  # a batch of 16 from 64 slots: nearly all of its frames were sent before


def test_a_reused_pool_index_is_a_different_frame():
    """A slot overwritten frees its frames; the pool hands the index out again with a new generation, so the mirror
    does not take the new frame for the one the learner holds."""
    pool_shard = PrioritizedShard(SPEC, 2, alpha=0.6, dedup_frames=True)
    g = Game(np.random.default_rng(3))
    pool_shard.add(g.records(2), np.ones(2))
    pool = pool_shard.store.pool
    before = pool.generation.copy()
    for _ in range(5):  # both slots overwritten again and again: their frames freed, the indices handed out again
        pool_shard.add(g.records(2), np.ones(2))
    assert ((pool.generation > before) & (before > 0)).any()
    m = CacheMirror(8)
    uniq = np.array([1, 9])  # both go into slot 1: the last one is kept, on both sides
    place, send, install = m.split(uniq, np.ones(16, np.int64))
    assert place.tolist() == [8, 9] and send.tolist() == [1, 9] and install.tolist() == [-1, 1]
    place, send, _ = m.split(np.array([9]), np.ones(16, np.int64))
    assert place.tolist() == [1] and len(send) == 0  # held
    gens = np.ones(16, np.int64)
    gens[9] = 2
    place, send, install = m.split(np.array([9]), gens)
    assert place.tolist() == [8] and send.tolist() == [9] and install.tolist() == [1]  # a new generation: sent


@pytest.mark.mpi
def test_a_breakout_job_with_the_cache_sends_fewer_frames_than_it_trains_on(tmp_path):
    """A Breakout job with the learner's cache (larger than the buffer's pool; several buffers: the test above):
    every role exits 0, the shards table counts hits, misses and bytes saved, and the replies carry less than one
    frame per trained experience (without the cache each carries at least one, test_mpi_runs.py)."""
    import h5py

    from conftest import JOBS, run_mpi
    job = run_mpi(4, tmp_path, "run.train_steps=40", "replay.learning_starts=300", "replay.capacity=2048",
                  "env.envs_per_actor=2", "replay.frame_cache=4096",
                  job=JOBS / "breakout_proposed_small.toml", timeout=240)
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        t, s = f["learner/train"], f["learner/shards"]
        assert t["train_steps"][-1] == 40 and np.isfinite(t["loss"][()]).any()
        c = {k: int(s[k][-1]) for k in ("cache_hits", "cache_misses", "cache_bytes_saved")}
        assert c["cache_hits"] > 0 and c["cache_misses"] > 0, c
        assert c["cache_bytes_saved"] == 7_056 * c["cache_hits"]
        trained = 40 * int(f["learner"].attrs["batch_size"])
        assert t["bytes_in"][-1] < 7_056 * trained, t["bytes_in"][-1] / trained
