"""Where the Atari replay's time goes: `mpirl bench replay`'s shard taken apart.

    python analysis/replay_profile.py [--capacity 65536] [--reps 5]

The bench's memory at its shape (frames once, 4 interleaved games, batches of 512,
messages of 64), filled as the bench fills it. Printed side by side, each the median
of ``--reps`` repetitions:

* a sample into the reply (with IS weights), and its parts: the tree descent, finding
  the batch's distinct frames (the compiled radix pass, and ``np.unique`` on the same batch),
  copying those frames; the gather floor, timed in turns with the sample;
* an insert of one actor message, and the plain copy of its frames (the rest is the
  code around it);
* with cpprb installed, cpprb's sample; for each memory, the huge pages backing it
  (``AnonHugePages`` of this process, before and after it is built).
"""

from __future__ import annotations

import argparse
import gc
import statistics

import numpy as np

from mpirl.agents.dqn import transition_spec
from mpirl.bench.replay import ATARI, BATCH, INSERT, Cpprb, Ours, Stream, _floor, _in_turns, _timed
from mpirl.replay.batch_frames import distinct_frames


def huge_pages_kb() -> int:
    """This process's anonymous huge pages in kB (Linux; 0 where the kernel does not say)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("AnonHugePages")), 0)
    except OSError:
        return 0


def filled(impl, spec: dict, capacity: int):
    before = huge_pages_kb()
    mem, stream, rng = impl(spec, capacity), Stream(*ATARI, seed=3), np.random.default_rng(7)
    while mem.size < capacity:
        mem.insert(*mem.incoming(stream, rng.random(INSERT) * 2))
    return mem, stream, (huge_pages_kb() - before) / 1024


def us(calls_per_s: list[float]) -> float:
    return 1e6 / statistics.median(calls_per_s)


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=65_536)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    spec, reps = transition_spec(*ATARI), args.reps
    mem, stream, huge = filled(Ours, spec, args.capacity)
    shard, store = mem.shard, mem.shard.store
    rng = np.random.default_rng(1)
    ids = shard.sample(BATCH, rng, out=None).ids
    used = store.frame_cols[ids]
    store.gather_framed(ids, mem.views, mem.views["frames"])  # makes the scratch
    uniq, _ = distinct_frames(store.frame_cols, ids, store.pool.max_frames)
    n = uniq.size
    frames_out = mem.views["frames"]
    sample, floor = _in_turns((mem.sample, None), _floor(spec, args.capacity), reps, 0.3)
    t = {
        "sample into the reply": us(sample),
        "  tree descent (no gather)": us(_timed(lambda: shard.sample(BATCH, rng, out=None), reps=reps)),
        "  distinct frames, compiled": us(_timed(lambda: distinct_frames(store.frame_cols, ids,
                                                                         store.pool.max_frames), reps=reps)),
        "  distinct frames, np.unique": us(_timed(lambda: np.unique(used, return_inverse=True), reps=reps)),
        f"  copy of the batch's {n} distinct frames": us(_timed(
            lambda: np.take(store.pool.frames, uniq, axis=0, out=frames_out[:n], mode="clip"), reps=reps)),
        "gather floor (in turns with the sample)": us(floor),
        "insert of one message": us(_timed(mem.insert, lambda: mem.incoming(stream, rng.random(INSERT) * 2),
                                           reps=reps)),
    }
    message = mem.message.views(mem.inbox)["frames"]
    pool_part = np.empty_like(message)
    t["  plain copy of its frames"] = us(_timed(lambda: np.copyto(pool_part, message), reps=reps))
    pages = {"ours": huge}
    del mem, stream
    gc.collect()
    try:
        theirs, _, pages["cpprb"] = filled(Cpprb, spec, args.capacity)
        t["cpprb sample"] = us(_timed(theirs.sample, reps=reps))
        del theirs
    except ImportError:
        print("cpprb not installed: pip install 'mpirl[bench]'")
    for what, v in t.items():
        print(f"{what:<45} {v:>9.1f} us")
    for what, mb in pages.items():
        print(f"huge pages backing {what:<26} {mb:>9.0f} MB")
    return {**t, **{f"huge pages MB {k}": v for k, v in pages.items()}}


if __name__ == "__main__":
    main()
