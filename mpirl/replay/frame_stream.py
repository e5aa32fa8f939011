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

Pure numpy: the messages themselves are built in :mod:`mpirl.actor_learner.experience`.
"""

from __future__ import annotations

import numpy as np
from mpirl.replay.compiled import kernel

from .frames import FramePool


@kernel
def _lookup(idx, start, end, offset, ids, out):  # pragma: no cover - compiled
    """``out[i] = idx[ids[i] - offset]``; 1 if an id falls outside ``idx[start:end]``."""
    for i in range(ids.size):
        j = ids[i] - offset
        if j < start or j >= end:
            return 1
        out[i] = idx[j]
    return 0


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
        self.games = np.zeros(size, dtype=np.int32)  # the game each frame came from
        self.next_id = 0  # the id of the next new frame
        self.sent = 0  # frames [sent, next_id) have not been sent yet
        self.floor = 0  # no frame below it is referred to (as of the last send)
        self.stacks = np.full((games, self.depth), -1, dtype=np.int64)  # each game's current stack

    # -- frames in -----------------------------------------------------------------
    def _new(self, frames: np.ndarray, game: int) -> np.ndarray:
        m = len(frames)
        if self.next_id + m - self.floor > len(self.ring):
            self._grow(self.next_id + m - self.floor)
        ids = np.arange(self.next_id, self.next_id + m, dtype=np.int64)
        at = ids & (len(self.ring) - 1)
        self.ring[at] = frames
        self.games[at] = game
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
        games, self.games = self.games, np.zeros(size, dtype=np.int32)
        self.games[live & (size - 1)] = games[live & (len(old) - 1)]

    def start(self, game: int, stack: np.ndarray) -> np.ndarray:
        """A new episode's first stack ``(depth, *frame_shape)``: every frame new. Returns its ids (a new array)."""
        ids = self._new(stack, game)
        self.stacks[game] = ids
        return ids

    def advance(self, game: int, stack: np.ndarray) -> np.ndarray:
        """The stack after a step of ``game``: the last one shifted, plus its last frame. Returns its ids."""
        if not self.shifts or self.stacks[game, 0] < 0:
            return self.start(game, stack)
        ids = np.empty(self.depth, dtype=np.int64)
        ids[:-1] = self.stacks[game, 1:]
        ids[-1] = self._new(stack[-1:], game)[0]
        self.stacks[game] = ids
        return ids

    # -- frames out ------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Frames made since the last send."""
        return self.next_id - self.sent

    def copy_pending(self, out: np.ndarray, games: np.ndarray) -> int:
        """Copy the frames made since the last send into ``out[:pending]`` and their games into
        ``games[:pending]``; returns the first one's id."""
        at = np.arange(self.sent, self.next_id, dtype=np.int64) & (len(self.ring) - 1)
        np.take(self.ring, at, axis=0, out=out[:len(at)])
        np.take(self.games, at, out=games[:len(at)])
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
        the form :func:`mpirl.agents.tensors.to_tensors` rebuilds stacks from (the actor's priorities)."""
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
        # sender -> [id of the window's first frame, start, end, int32 array]: the window's pool indices are
        # array[start:end], for frame ids base, base + 1, ...
        self.windows: dict[int, list] = {}

    def _window(self, sender: int) -> list:
        w = self.windows.get(sender)
        if w is None:
            w = self.windows[sender] = [0, 0, 0, np.zeros(256, np.int32)]
        return w

    def receive(self, sender: int, first: int, frames: np.ndarray, games: np.ndarray | None = None) -> None:
        """The sender's new frames, ids ``first, first + 1, ...``: one window reference each.

        ``games``: the game each frame came from. A game's frames then go into the pool side by side
        (in id order), so the frames of one transition's stacks lie together and a sample's gather
        reads runs of memory instead of frames scattered among the other games'."""
        w = self._window(sender)
        base, start, end, idx = w
        if first != base + end - start:
            raise RuntimeError(f"frames of sender {sender} start at id {first}, expected {base + end - start}")
        m = len(frames)
        if not m:
            return
        if end + m > len(idx):  # move the window to the front, and grow the array if still short
            live = idx[start:end].copy()
            if len(live) + m > len(idx) // 2:
                idx = w[3] = np.zeros(2 * (len(live) + m), np.int32)
            idx[:len(live)] = live
            start, end = w[1], w[2] = 0, len(live)
        if games is None or m == 1:
            idx[end:end + m] = self.pool.adopt(frames, np.ones(m, np.int32))
        else:
            order = np.argsort(games, kind="stable")
            idx[end + order] = self.pool.adopt(frames, np.ones(m, np.int32), order)
        w[2] = end + m

    def lookup(self, sender: int, ids: np.ndarray) -> np.ndarray:
        """Pool indices (int32, same shape) of the sender's frames ``ids``."""
        base, start, end, idx = self._window(sender)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty(ids.shape, np.int32)
        if _lookup(idx, start, end, base - start, ids.reshape(-1), out.reshape(-1)):
            raise RuntimeError(f"sender {sender} refers to frames outside its window [{base}, {base + end - start})")
        return out

    def forget(self, sender: int, oldest: int) -> None:
        """Drop the window's frames below id ``oldest`` (the pool frees those no slot refers to)."""
        w = self._window(sender)
        base, start, end, idx = w
        cut = min(max(int(oldest) - base, 0), end - start)
        if cut:
            self.pool.release(idx[start:start + cut])
            w[0], w[1] = base + cut, start + cut

    def close(self, sender: int) -> None:
        """The sender is done: its whole window goes."""
        if sender in self.windows:
            base, start, end, _ = self.windows[sender]
            self.forget(sender, base + end - start)

    @property
    def held(self) -> int:
        """Frames held by windows (each also counted in the pool)."""
        return sum(end - start for _, start, end, _ in self.windows.values())
