"""Replay shard against cpprb and the machine's gather floor, at the paper's shape.

    mpirl bench replay [--reps 5] [--capacity 65536]

Shapes: Atari (uint8 (4, 84, 84) frame stacks, as actors send them) and CartPole
(float32 (4,)). Capacity 65,536, learner batch 512, actor messages of 64. In the
same process, both memories full side by side, each operation of ours and cpprb
timed in turns, repetition by repetition (a shared machine drifts; two numbers
taken a minute apart would put the drift into the ratio):

* **insert**: add a message of 64 transitions with their priorities to a full
  memory (so old records are overwritten, as in a running job). Ours takes the
  message an Atari actor sends (each new frame once, stacks as frame ids, see
  :mod:`mpirl.replay.frame_stream`) and stores it as the buffer rank does; cpprb
  takes the transitions as stacks, as its API has them.
* **sample**: a prioritized batch of 512 *including* gathering the records into
  the outgoing message buffer (ours: straight into a reply layout, as the
  buffer rank does; Atari: each distinct frame of the batch once plus indices)
  and the importance weights.
* **priority update**: new priorities for the 512 ids of a batch, fresh values
  every call (drawn untimed), as a learner sends them. Re-sending the same
  values would flatter a memory that skips unchanged leaves or defers the tree
  work: cpprb takes ~8 us for a repeat and ~60 us for fresh values here.
* **gather floor** (Atari): ``numpy.take(rows, 512 random ids, out=preallocated,
  mode='clip')`` of 56,448-byte rows: copying the batch's bytes and nothing else.
  Our sample and the floor take turns, repetition by repetition, so drifts of
  the machine (clock, memory, neighbours) hit both alike.

The Atari stream is synthetic but shaped like a real one: four games interleaved,
each step one new frame (every frame unique), a transition's ``obs`` the last four
frames and its ``next_obs`` the four frames three steps later, so consecutive
transitions share frames exactly as an actor's do. Every frame unique is the worst
case for storing frames once; real games repeat frames and cost less.
"""

from __future__ import annotations

import gc
import time

import numpy as np

from mpirl.agents.dqn import transition_spec
from mpirl.bench.report import MIN_REPS, Row
from mpirl.comm.messages import experience_layout, sample_layout
from mpirl.replay.frame_stream import FrameWindows, window_frames
from mpirl.replay.frames import framed_fields
from mpirl.replay.shard import PrioritizedShard
from mpirl.replay.weights import importance_weights
from mpirl.actor_learner.experience import store_experience

INSERT, BATCH, N_STEP, GAMES = 64, 512, 3, 4
ATARI, CARTPOLE = ((4, 84, 84), np.uint8), ((4,), np.float32)


class Stream:
    """Messages of ``INSERT`` transitions from ``GAMES`` interleaved games (see the module docstring)."""

    def __init__(self, obs_shape: tuple, dtype, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.shape, self.dtype = obs_shape, np.dtype(dtype)
        self.image = len(obs_shape) == 3
        self.t = 0
        if self.image:
            depth, h, w = obs_shape
            self.base = self.rng.integers(0, 256, size=(h, w), dtype=np.uint8)
            self.depth = depth

    def _frames(self, numbers: np.ndarray) -> np.ndarray:
        """Unique frames: the base image with the frame number in its first 8 bytes."""
        out = np.broadcast_to(self.base, (*numbers.shape, *self.base.shape)).copy()
        flat = out.reshape(*numbers.shape, -1)
        flat[..., :8] = numbers.astype("<u8")[..., None].view(np.uint8).reshape(*numbers.shape, 8)
        return out

    def next_ids(self) -> dict:
        """:meth:`next` as an actor with frames once sends it: frame ids (``<name>_fid``; frame number ``f``
        has id ``f + (depth - 1) * GAMES``), ``frames`` = (every frame up to the last one referred to, the
        first one's id) and ``oldest``, the oldest frame the next message refers to."""
        t0 = self.t
        rec = self.next()
        back = np.arange(-self.depth + 1, 1)
        steps = t0 + np.repeat(np.arange(INSERT // GAMES), GAMES)
        game = np.tile(np.arange(GAMES), INSERT // GAMES)
        shift = (self.depth - 1) * GAMES
        rec["obs_fid"] = (steps[:, None] + back) * GAMES + game[:, None] + shift
        rec["next_obs_fid"] = (steps[:, None] + N_STEP + back) * GAMES + game[:, None] + shift
        del rec["obs"], rec["next_obs"]
        made = getattr(self, "made", 0)
        upto = int(rec["next_obs_fid"].max()) + 1
        rec["frames"] = (self._frames(np.arange(made, upto) - shift), made)
        self.made = upto
        rec["oldest"] = (self.t - self.depth + 1) * GAMES + shift
        return rec

    def next(self) -> dict[str, np.ndarray]:
        steps = INSERT // GAMES
        t = self.t + np.repeat(np.arange(steps), GAMES)  # step of each row
        game = np.tile(np.arange(GAMES), steps)
        self.t += steps
        rec = {"action": self.rng.integers(0, 4, INSERT), "reward": self.rng.random(INSERT, np.float32),
               "done": np.zeros(INSERT, bool), "discount": np.full(INSERT, 0.99 ** N_STEP, np.float32)}
        if self.image:
            back = np.arange(-self.depth + 1, 1)
            number = lambda step: (step[:, None] + back) * GAMES + game[:, None]  # noqa: E731
            rec["obs"], rec["next_obs"] = self._frames(number(t)), self._frames(number(t + N_STEP))
        else:
            rec["obs"] = self.rng.standard_normal((INSERT, *self.shape)).astype(self.dtype)
            rec["next_obs"] = self.rng.standard_normal((INSERT, *self.shape)).astype(self.dtype)
        return rec


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class Ours:
    name = "mpirl PrioritizedShard"

    def __init__(self, spec: dict, capacity: int, seed: int = 1):
        self.framed = framed_fields(spec)
        extra = window_frames(INSERT, GAMES, N_STEP, self.framed) if self.framed else 0
        self.shard = PrioritizedShard(spec, capacity, alpha=0.6, eps=1e-6, dedup_frames=True, stream_frames=extra)
        self.layout = sample_layout(spec, BATCH, self.framed)
        self.reply = self.layout.buffer()  # the outgoing message
        counted = {"frames": self.layout.counted["frames"][2]} if self.framed else {}
        self.views = self.layout.views(self.reply, BATCH, **counted)
        self.rng = np.random.default_rng(seed)
        self.last = None
        if self.framed:  # actor messages as they arrive: frames once, stacks as frame ids
            self.windows = FrameWindows(self.shard.store.pool)
            self.message = experience_layout(spec, INSERT, self.framed, GAMES)
            self.inbox = self.message.buffer()
            self.sent = 0  # frames of the stream sent so far

    def incoming(self, stream: "Stream", prio: np.ndarray) -> tuple:
        """The next message (untimed). Atari: packed as an actor sends it, each frame once, stacks as frame ids."""
        if not self.framed:
            return stream.next(), prio
        rec = stream.next_ids()
        frames, first = rec.pop("frames")
        oldest = rec.pop("oldest")
        self.message.pack(self.inbox, {**rec, "priority": prio}, actor=1, frames_rows=len(frames),
                          frame_games_rows=len(frames), first_frame=first, oldest_frame=oldest)
        views = self.message.views(self.inbox)
        views["frames"][:] = frames
        views["frame_games"][:] = np.arange(first, first + len(frames)) % GAMES  # the stream's game of each id
        return None, None

    def insert(self, rec: dict | None, prio: np.ndarray | None) -> None:
        if not self.framed:
            self.shard.add(rec, prio)
        else:  # as the buffer rank stores a message
            store_experience(self.shard, self.message, self.inbox, True, self.windows, self.framed)

    def sample(self) -> None:
        self.last = self.shard.sample_into(BATCH, self.rng, self.views)
        importance_weights(self.last.probs, self.shard.size, 0.4)

    def update(self, prio: np.ndarray) -> None:
        s = self.last
        self.shard.update_priorities(s.ids, s.versions, prio)

    @property
    def size(self) -> int:
        return self.shard.size

    @property
    def bytes_per_slot(self) -> float:
        return self.shard.nbytes / self.shard.size


class Cpprb:
    name = "cpprb PrioritizedReplayBuffer"

    def __init__(self, spec: dict, capacity: int, seed: int = 1):
        import cpprb
        np.random.seed(seed)  # cpprb samples with numpy's global generator
        env = {name: {"shape": shape or 1, "dtype": dtype} for name, (shape, dtype) in spec.items()}
        self.rb = cpprb.PrioritizedReplayBuffer(capacity, env, alpha=0.6, eps=1e-6)
        self.last = None
        self.per_slot = sum(int(np.prod(shape or (1,))) * np.dtype(dtype).itemsize for shape, dtype in spec.values())

    def incoming(self, stream: Stream, prio: np.ndarray) -> tuple:
        return stream.next(), prio

    def insert(self, rec: dict, prio: np.ndarray) -> None:
        self.rb.add(priorities=prio, **rec)

    def sample(self) -> None:
        self.last = self.rb.sample(BATCH, beta=0.4)

    def update(self, prio: np.ndarray) -> None:
        self.rb.update_priorities(self.last["indexes"], prio)

    @property
    def size(self) -> int:
        return self.rb.get_stored_size()

    @property
    def bytes_per_slot(self) -> float:
        return float(self.per_slot)


def _timed(op, prepare=None, reps: int = MIN_REPS, seconds: float = 0.3, per_call: float = 1.0) -> list[float]:
    """Per repetition: ``per_call`` x calls/s of ``op`` alone, with ``prepare()`` untimed before each call."""
    out = []
    for rep in range(reps + 1):  # the first is a warm-up
        spent, calls = 0.0, 0
        while spent < seconds or calls < 3:
            arg = prepare() if prepare else None
            t = time.perf_counter()
            op() if prepare is None else op(*arg)
            spent += time.perf_counter() - t
            calls += 1
        if rep:
            out.append(per_call * calls / spent)
    return out


def _filled(impl, spec: dict, capacity: int, obs: tuple, prio_rng: np.random.Generator, memory: Row):
    """A full memory of ``impl`` (filled untimed) and its stream; its bytes per slot go into ``memory``."""
    gc.collect()
    before = _rss()
    mem = impl(spec, capacity)
    stream = Stream(*obs, seed=3)
    while mem.size < capacity:
        mem.insert(*mem.incoming(stream, prio_rng.random(INSERT) * 2))
    grown = _rss() - before
    memory.values[impl.name] = [mem.bytes_per_slot]
    if len(obs[0]) == 3:  # GB-sized: the process's resident memory confirms the count (small ones hide in the heap)
        memory.values[f"{impl.name} (process RSS growth)"] = [grown / capacity]
    return mem, stream


def _ops(mem, stream, prio_rng: np.random.Generator) -> dict[str, tuple]:
    """Per row key: (call, untimed preparation or None, per_call) of ``mem``."""
    return {"insert": (mem.insert, lambda: mem.incoming(stream, prio_rng.random(INSERT) * 2), INSERT),
            "sample": (mem.sample, None, 1.0),
            "update": (mem.update, lambda: (prio_rng.random(BATCH) * 2,), BATCH)}


def bench_shape(label: str, obs: tuple, capacity: int, reps: int, seconds: float, with_cpprb: bool) -> list[Row]:
    """One shape's rows. Ours and cpprb live side by side and every operation is timed in turns, repetition by
    repetition (``_in_turns``), as our sample and the floor are: a drift of the shared machine between two
    measurements one after the other would otherwise be read as a ratio. Peak memory stays one Atari-sized
    reference: the floor's rows are gone before cpprb's memory is made."""
    spec = transition_spec(*obs)
    image = len(obs[0]) == 3
    measured = (("insert", "insert (messages of 64)", "transitions/s", 2.0 if image else 1.0),
                ("sample", "sample 512 + IS weights into the message", "batches/s", 2.0),
                ("update", "priority update of 512 ids", "ids/s", 1.0))
    rows = {key: Row(f"{label} {name}", unit, Ours.name, Cpprb.name, target=target)
            for key, name, unit, target in measured}
    memory = Row(f"{label} memory per slot", "bytes", Ours.name, Cpprb.name, higher_is_better=False,
                 at_most=16_384 if image else None)
    prio_rng = np.random.default_rng(7)
    ours, ours_stream = _filled(Ours, spec, capacity, obs, prio_rng, memory)
    mine = _ops(ours, ours_stream, prio_rng)
    if image:  # against the floor, in turns; its rows are freed on return
        on_floor, floor = _in_turns(mine["sample"][:2], _floor(spec, capacity), reps, seconds)
    theirs = None
    if with_cpprb:
        ref, ref_stream = _filled(Cpprb, spec, capacity, obs, prio_rng, memory)
        theirs = _ops(ref, ref_stream, prio_rng)
    for key, row in rows.items():
        if key == "update":  # each memory's last sample is what its updates are for
            ours.sample()
            if theirs:
                ref.sample()
        op, prepare, per_call = mine[key]
        if theirs is None:
            row.values[Ours.name] = _timed(op, prepare, reps, seconds, per_call)
        else:
            row.values[Ours.name], row.values[Cpprb.name] = _in_turns((op, prepare), theirs[key][:2], reps, seconds,
                                                                      per_call)
    out = [*rows.values(), memory]
    if image:
        out.append(gather_floor(spec, on_floor, floor))
    if not with_cpprb:
        for r in out:
            r.note = "cpprb not installed: pip install 'mpirl[bench]'"
    return out


def _stack_row_bytes(spec: dict) -> int:
    """Bytes of one transition's obs + next_obs stacks: a row of the floor."""
    return 2 * int(np.prod(spec["obs"][0])) * spec["obs"][1].itemsize


def _floor(spec: dict, capacity: int):
    """The floor's call and its untimed preparation: ``np.take`` of BATCH random rows of obs + next_obs bytes
    into a preallocated buffer (the rows live as long as the returned functions)."""
    row_bytes = _stack_row_bytes(spec)
    rows = np.zeros((capacity, row_bytes), np.uint8)
    rows[:, ::4096] = 1  # touch every page once so the gather reads resident memory
    out = np.empty((BATCH, row_bytes), np.uint8)
    rng = np.random.default_rng(11)
    return (lambda ids: np.take(rows, ids, axis=0, out=out, mode="clip"),
            lambda: (rng.integers(0, capacity, BATCH),))


def _in_turns(mine: tuple, other: tuple, reps: int, seconds: float,
              per_call: float = 1.0) -> tuple[list[float], list[float]]:
    """``per_call`` x calls/s of two operations, each a (call, untimed preparation or None), one repetition of each
    in turn."""
    a, b = [], []
    for _ in range(reps):
        a += _timed(mine[0], mine[1], reps=1, seconds=seconds, per_call=per_call)
        b += _timed(other[0], other[1], reps=1, seconds=seconds, per_call=per_call)
    return a, b


def gather_floor(spec: dict, ours: list[float], floor: list[float]) -> Row:
    """The Atari sample against the floor (timed in turns with it, see ``_in_turns``)."""
    r = Row("atari sample 512 vs the gather floor", "batches/s", Ours.name, "numpy take floor", target=1.0,
            note=f"floor: np.take of {BATCH} random {_stack_row_bytes(spec):,} B rows into a preallocated buffer, "
                 "timed in turns with ours")
    r.values[Ours.name] = ours
    r.values["numpy take floor"] = floor
    return r


def run(reps: int = MIN_REPS, capacity: int = 65_536, seconds: float = 0.3) -> list[Row]:
    try:
        import cpprb  # noqa: F401
        with_cpprb = True
    except ImportError:
        with_cpprb = False
    rows = bench_shape("atari", ATARI, capacity, reps, seconds, with_cpprb)
    rows += bench_shape("cartpole", CARTPOLE, capacity, reps, seconds, with_cpprb)
    return rows
