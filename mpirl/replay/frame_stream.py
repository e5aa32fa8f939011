"""Frames once on the wire: a sender numbers each new frame once; a receiver keeps what may still be referred to.

An Atari sender (an actor, or an inference worker for its actors) knows which frame of each stack is
new: a game's stack after a step is the stack before it shifted by one, plus the frame the step made,
and a new episode's first stack is new throughout. :class:`FrameStream` gives every new frame the
next number of the sender's stream (a *frame id*, counted from 0, never reused) and keeps each
game's current stack as ids. Transitions then name their ``obs`` and ``next_obs`` by ids, and a
message carries the frames made since the sender's last message once, plus ``oldest``: no later
transition refers to a frame below it (every frame below is out of every game's stack, n-step window
and staged transition).

On the receiving side, :class:`FrameWindows` holds one window per sender: the pool indices of the
sender's frames from its ``oldest`` on. A window holds one reference to each of its frames in the
:class:`~mpirl.replay.frames.FramePool`; the slots that store a transition hold one more per use.
Frames leave the window when ``oldest`` passes them, and the pool frees them when no slot refers to
them any more. Nothing compares frame bytes or fingerprints on either side.

Pure numpy: the messages themselves are built in :mod:`mpirl.roles.experience`.
"""

from __future__ import annotations

import numpy as np

from .frames import FramePool


class FrameStream:
    """A sender's frames, each numbered once, and its games' current stacks as frame ids.

    ``shifts``: the environment's stacks shift by one frame per step (ale-py's frame stack). Without
    it every frame of every stack counts as new (correct for any uint8 stack, with no saving).
    Frames wait in a ring until sent, and stay while referred to; the ring grows when needed.
    """

    def __init__(self, games: int, depth: int, frame_shape: tuple[int, ...], shifts: bool = True, ring: int = 256):
        self.depth, self.shifts = int(depth), bool(shifts)
        size = 1 << max(int(ring) - 1, 1).bit_length()
        self.ring = np.zeros((size, *frame_shape), dtype=np.uint8)
        self.next_id = 0  # the id of the next new frame
        self.sent = 0  # frames [sent, next_id) have not been sent yet
        self.floor = 0  # no frame below it is referred to (as of the last send)
        self.stacks = np.full((games, self.depth), -1, dtype=np.int64)  # each game's current stack

    # -- frames in -----------------------------------------------------------------
    def _new(self, frames: np.ndarray) -> np.ndarray:
        m = len(frames)
        if self.next_id + m - self.floor > len(self.ring):
            self._grow(self.next_id + m - self.floor)
        ids = np.arange(self.next_id, self.next_id + m, dtype=np.int64)
        self.ring[ids & (len(self.ring) - 1)] = frames
        self.next_id += m
        return ids

    def _grow(self, need: int) -> None:
        """A ring at least twice ``need`` frames, the live frames [floor, next_id) at their new places."""
        old, size = self.ring, len(self.ring)
        while size < 2 * need:
            size *= 2
        live = np.arange(self.floor, self.next_id, dtype=np.int64)
        self.ring = np.zeros((size, *old.shape[1:]), dtype=np.uint8)
        self.ring[live & (size - 1)] = old[live & (len(old) - 1)]

    def start(self, game: int, stack: np.ndarray) -> np.ndarray:
        """A new episode's first stack ``(depth, *frame_shape)``: every frame new. Returns its ids (a new array)."""
        ids = self._new(stack)
        self.stacks[game] = ids
        return ids

    def advance(self, game: int, stack: np.ndarray) -> np.ndarray:
        """The stack after a step of ``game``: the last one shifted, plus its last frame. Returns its ids."""
        if not self.shifts or self.stacks[game, 0] < 0:
            return self.start(game, stack)
        ids = np.empty(self.depth, dtype=np.int64)
        ids[:-1] = self.stacks[game, 1:]
        ids[-1] = self._new(stack[-1:])[0]
        self.stacks[game] = ids
        return ids

    # -- frames out ------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Frames made since the last send."""
        return self.next_id - self.sent

    def copy_pending(self, out: np.ndarray) -> int:
        """Copy the frames made since the last send into ``out[:pending]``; returns the first one's id."""
        ids = np.arange(self.sent, self.next_id, dtype=np.int64)
        np.take(self.ring, ids & (len(self.ring) - 1), axis=0, out=out[:len(ids)])
        return self.sent

    def sent_upto(self, oldest: int) -> None:
        """Every frame made so far was sent; no frame below ``oldest`` will be referred to again."""
        self.sent = self.next_id
        self.floor = max(self.floor, int(oldest))

    def oldest(self, *referred: np.ndarray) -> int:
        """The oldest frame still referred to: by a game's current stack or by one of the ``referred`` id arrays."""
        low = self.next_id
        live = self.stacks[self.stacks[:, 0] >= 0, 0]
        if len(live):
            low = min(low, int(live.min()))
        for ids in referred:
            if len(ids):
                low = min(low, int(ids.min()))
        return low

    def batch(self, records: dict[str, np.ndarray], framed: dict) -> dict[str, np.ndarray]:
        """``records`` with each ``<name>_fid`` field as ``<name>_idx`` into ``frames`` = the ring (no copy):
        the form :func:`mpirl.agents.dqn.to_tensors` rebuilds stacks from (the actor's priorities)."""
        out = {k: v for k, v in records.items() if not k.endswith("_fid")}
        mask = len(self.ring) - 1
        for name in framed:
            out[f"{name}_idx"] = records[f"{name}_fid"] & mask
        out["frames"] = self.ring
        return out


def window_frames(send_batch: int, games: int, n_step: int, framed: dict) -> int:
    """Room to reserve for one sender's window: its live frames span a message's worth of frames (at most
    ``2 * send_batch`` wait before a send, plus a step's), the n-step windows and stacks of its ``games``, and
    the staged transitions behind them; four times that, since reserved room costs no memory until used."""
    depth = next(iter(framed.values()))[0]
    return 4 * (3 * send_batch + games * (n_step + 3 * depth + 2))


class FrameWindows:
    """Per sender, the pool indices of its frames that a later transition may refer to."""

    def __init__(self, pool: FramePool):
        self.pool = pool
        self.base: dict[int, int] = {}  # sender -> the id of its window's first frame
        self.idx: dict[int, np.ndarray] = {}  # sender -> int32 pool indices of frames base, base + 1, ...

    def receive(self, sender: int, first: int, frames: np.ndarray) -> None:
        """The sender's new frames, ids ``first, first + 1, ...``: one window reference each."""
        base, idx = self.base.setdefault(sender, 0), self.idx.setdefault(sender, np.zeros(0, np.int32))
        if first != base + len(idx):
            raise RuntimeError(f"frames of sender {sender} start at id {first}, expected {base + len(idx)}")
        if len(frames):
            self.idx[sender] = np.concatenate([idx, self.pool.adopt(frames, np.ones(len(frames), np.int32))])

    def lookup(self, sender: int, ids: np.ndarray) -> np.ndarray:
        """Pool indices (int32, same shape) of the sender's frames ``ids``."""
        local = np.asarray(ids, dtype=np.int64) - self.base.get(sender, 0)
        idx = self.idx.get(sender, np.zeros(0, np.int32))
        if local.size and (local.min() < 0 or local.max() >= len(idx)):
            raise RuntimeError(f"sender {sender} refers to frames outside its window "
                               f"[{self.base.get(sender, 0)}, {self.base.get(sender, 0) + len(idx)})")
        return idx[local]

    def forget(self, sender: int, oldest: int) -> None:
        """Drop the window's frames below id ``oldest`` (the pool frees those no slot refers to)."""
        base = self.base.get(sender, 0)
        cut = min(max(int(oldest) - base, 0), len(self.idx.get(sender, ())))
        if cut:
            self.pool.release(self.idx[sender][:cut])
            self.idx[sender] = self.idx[sender][cut:].copy()
            self.base[sender] = base + cut

    def close(self, sender: int) -> None:
        """The sender is done: its whole window goes."""
        if sender in self.idx:
            self.forget(sender, self.base[sender] + len(self.idx[sender]))

    @property
    def held(self) -> int:
        """Frames held by windows (each also counted in the pool)."""
        return sum(len(v) for v in self.idx.values())
