"""The learner's frame cache: experience bytes per trained experience and the learner's rebuild time, with and without.

    mpirl bench cache [--reps 5]

In one process, per shape, a buffer's shard full of Atari frames (the replay bench's synthetic stream: four games
interleaved, every frame unique, frames once as actors send them) serves the learner batch after batch while new
experiences arrive at ``1 / samples_per_insert`` per trained experience, as a job held by ``samples_per_insert``
does. The same stream, the same draws, three ways:

* **proposed + cache** (``replay.frame_cache`` = every frame the memory can hold): a sampled reply carries the
  batch's frames the learner does not hold (:mod:`mpirl.replay.frame_cache`);
* **proposed** (no cache): a reply carries each distinct frame of the batch once;
* **baseline**: every ``n_replay`` batches a dump of the whole memory, each frame once.

Bytes are the messages' bytes (what the learner's ``bytes_in`` counts), over ``steps`` batches after a warm-up of
as many (the cache starts empty, as in a job; the warm-up's batches are not counted). The rebuild time is the
learner's side of a batch: replies joined into one batch and its stacks gathered into tensors on the CPU
(:func:`~mpirl.agents.tensors.to_tensors`), with the cache and without, in turns. Parameter broadcasts are the same for
both placements and are not counted (a job's ``bytes_out``).

Shapes: the Breakout small jobs' (capacity 32,768, batch 64, samples per insert 4, ``n_replay`` 128) and the paper's
(capacity 65,536, batch 512, ``n_replay`` 128, at samples per insert 4 too; its job lets actors run free, and then
what the cache saves depends on how fast they are). The issue's target: proposed with the cache moves at most half
the baseline's bytes per trained experience.
"""

from __future__ import annotations

import time

import numpy as np

from mpirl.agents.dqn import transition_spec
from mpirl.agents.tensors import to_tensors
from mpirl.bench.replay import INSERT, Ours, Stream
from mpirl.bench.report import MIN_REPS, Row
from mpirl.comm.messages import dump_layout, sample_layout
from mpirl.replay.frame_cache import CacheMirror, FrameCache, cache_slots, settle_slots
from mpirl.actor_learner.shard_links import batch_fields, joined

OBS = (4, 84, 84)  # an Atari stack
SHAPES = (("Breakout small", 32_768, 64, 4.0, 128), ("paper shape", 65_536, 512, 4.0, 128))
CACHE, PLAIN, BASELINE = "proposed + frame cache", "proposed", "baseline"


class TwoWays:
    """A full Atari shard (a memory of ``capacity``, filled as a job's is after its first minutes) and its replies of
    ``batch`` sampled both ways from the same draws: with the learner's frame cache (``with_cache``; the cache on
    ``device``) and without (``plain``, every distinct frame of the batch in the reply)."""

    def __init__(self, capacity: int, batch: int, device, seed: int = 0):
        spec = transition_spec(OBS, np.uint8)
        self.spec, self.batch = spec, batch
        self.mem, self.stream = Ours(spec, capacity, seed=seed), Stream(OBS, np.uint8, seed=seed)
        self.rng = np.random.default_rng(seed + 1)
        while self.mem.size < capacity:
            self.mem.insert(*self.mem.incoming(self.stream, self._prio()))
        self.shard, framed = self.mem.shard, self.mem.framed
        self.framed = framed
        slots = cache_slots(capacity * sum(d for d, _ in framed.values()), capacity, framed)
        self.with_cache, self.plain = sample_layout(spec, batch, framed, cache=True), sample_layout(spec, batch, framed)
        self.names = {lay: batch_fields(lay) for lay in (self.with_cache, self.plain)}
        self.bufs = {lay: lay.buffer() for lay in (self.with_cache, self.plain)}
        self.mirror = CacheMirror(slots)
        self.cache = FrameCache(1, slots, self.with_cache.counted["frames"][2], OBS[1:], device)
        self.owed = 0.0  # experiences due to arrive

    def _prio(self) -> np.ndarray:
        return self.rng.random(INSERT).astype(np.float32) + 0.1

    def arrive(self, spi: float) -> None:
        """The experiences that arrive while one batch is trained: 1 / ``spi`` a trained one, a message at a time."""
        self.owed += self.batch / spi
        while self.owed >= INSERT:
            self.mem.insert(*self.mem.incoming(self.stream, self._prio()))
            self.owed -= INSERT

    def replies(self):
        """One draw's two replies, with the cache then without: ``(cached, layout, its views, frames sent)``."""
        draw = int(self.rng.integers(2**63))  # the same batch both ways
        for lay, m in ((self.with_cache, self.mirror), (self.plain, None)):
            buf = self.bufs[lay]
            views = lay.views(buf, self.batch, **{c: most for c, (_, _, most) in lay.counted.items()})
            sent = self.shard.sample_into(self.batch, np.random.default_rng(draw), views, m)
            if m is not None:
                settle_slots(lay, buf, self.batch, sent.frames)
            lay.set(buf, rows=self.batch, **{f"{c}_rows": sent.frames for c in lay.counted})
            yield m is not None, lay, lay.views(buf), sent.frames

    def fields(self, cached: bool, lay, views) -> dict:
        """The learner's side: a reply joined into the batch's fields (the stacks rebuilt from the cache or not)."""
        return self.cache.join([views], self.names[lay]) if cached else joined([views], self.names[lay])


def measure(capacity: int, batch: int, spi: float, n_replay: int, steps: int, seed: int = 0) -> dict:
    """Bytes per trained experience of each way, and the learner's rebuild seconds per batch with the cache and
    without, over ``steps`` batches after as many of warm-up."""
    import torch
    two = TwoWays(capacity, batch, torch.device("cpu"), seed)
    dump = dump_layout(two.spec, capacity, two.framed)
    dump_views = dump.views(dump.buffer(), capacity, frames=dump.counted["frames"][2])
    out = {CACHE: 0, PLAIN: 0, BASELINE: 0}
    rebuild: dict[str, list[float]] = {CACHE: [], PLAIN: []}
    for step in range(2 * steps):
        counted = step >= steps
        two.arrive(spi)
        for cached, lay, views, frames in two.replies():
            t = time.perf_counter()
            to_tensors(two.fields(cached, lay, views), torch.device("cpu"))
            if counted:
                rebuild[CACHE if cached else PLAIN].append(time.perf_counter() - t)
                out[CACHE if cached else PLAIN] += lay.nbytes(batch, **{c: frames for c in lay.counted})
        if counted and (step - steps) % n_replay == 0:
            rows, frames = two.shard.store.export_framed(dump_views, dump_views["frames"])  # type: ignore[attr-defined]
            out[BASELINE] += dump.nbytes(rows, frames=frames)
    trained = steps * batch
    return {"bytes": {k: v / trained for k, v in out.items()},
            "rebuild": {k: float(np.median(v)) for k, v in rebuild.items()},
            "hits": int(two.cache.hits.sum()), "misses": int(two.cache.misses.sum())}


def run(reps: int = MIN_REPS, steps: int = 256, shapes=SHAPES) -> list[Row]:
    rows = []
    for label, capacity, batch, spi, n_replay in shapes:
        got = [measure(capacity, batch, spi, n_replay, steps, seed=rep) for rep in range(reps)]
        note = (f"capacity {capacity:,}, batch {batch}, samples per insert {spi:g}, n_replay {n_replay}, "
                f"{steps} batches after {steps} of warm-up; hits/misses {got[-1]['hits']:,}/{got[-1]['misses']:,}")
        for ours in (CACHE, PLAIN):
            r = Row(f"experience bytes per trained experience, {label}: {ours} vs {BASELINE}", "B", ours, BASELINE,
                    higher_is_better=False, target=2.0 if ours == CACHE else None, note=note)
            r.values = {ours: [g["bytes"][ours] for g in got], BASELINE: [g["bytes"][BASELINE] for g in got]}
            rows.append(r)
        r = Row(f"learner rebuild per batch, {label}: {CACHE} vs {PLAIN}", "ms", CACHE, PLAIN,
                higher_is_better=False, note="replies joined, stacks gathered into CPU tensors")
        r.values = {CACHE: [1e3 * g["rebuild"][CACHE] for g in got], PLAIN: [1e3 * g["rebuild"][PLAIN] for g in got]}
        rows.append(r)
    return rows
