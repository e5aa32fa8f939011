"""The messages of the job, as layouts over the algorithm's transition spec.

* experience (actor -> buffer, ``TAG_EXPERIENCE``): a batch of transitions with the
  actor's initial priorities; the header carries the actor's counters and the
  episodes it finished since its last message; ``final=1`` is its last message.
  With frames once (Atari, ``replay.dedup_frames``) the frame stacks travel as
  frame ids (``obs_fid``, ``next_obs_fid``, int64) of the sender's frame stream:
  the counted ``frames`` field holds the frames made since its last message once,
  ids ``first_frame``, ``first_frame + 1``, ..., and ``frame_games`` the game each
  came from (the buffer keeps a game's frames together); ``oldest_frame`` is the oldest
  frame a later message may still refer to (see :mod:`mpirl.replay.frame_stream`).
* request (learner -> buffer, ``TAG_REQUEST``): ``kind`` SAMPLE/DUMP/BYE, how many
  samples it wants, and the priorities of an earlier batch from this buffer
  (ids, versions, |TD|).
* sample (buffer -> learner, ``TAG_REPLY``): a prioritized batch with ids, slot
  versions, sampling probabilities and raw priorities; the header carries the
  shard's size and total priority and the group's counters and finished episodes.
  With frames once, the stacks travel as dumps carry them (below).
* dump (buffer -> learner, ``TAG_REPLY``, baseline): every stored experience with
  the priority its actor gave it. With frames stored once (Atari), the frame
  stacks travel as int32 indices (``obs_idx``, ``next_obs_idx``) into a counted
  ``frames`` field holding each distinct frame once.
* step (actor -> its inference worker, ``TAG_STEP``): one row per game over the
  algorithm's step spec (what the last actions led to, what to act on now); the header
  carries ``fresh`` (every game starts an episode), the actor's counters and how long
  it waited for its last actions.
* actions (worker -> actor, ``TAG_ACTIONS``): one row of actions per game; ``stop=1``
  instead ends the actor (it sends nothing more).
"""

from __future__ import annotations

import numpy as np

from mpirl.comm.layout import Layout

TAG_EXPERIENCE, TAG_REQUEST, TAG_REPLY, TAG_STEP, TAG_ACTIONS = 11, 12, 13, 14, 15
SAMPLE, DUMP, BYE = 1, 2, 3

# Finished episodes reported per experience message (more wait for the next message), and the fewest returns a
# reply to the learner holds.
EPISODE_SLOTS = 32

F32, F64, I64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)


def as_frame_ids(spec: dict, framed: dict) -> dict:
    """``spec`` with each frame-stack field as ``<name>_fid`` (depth,) int64, in place: what a sender stages."""
    return {(f"{name}_fid" if name in framed else name): (((framed[name][0],), I64) if name in framed else v)
            for name, v in spec.items()}


def message_frames(send_batch: int, games: int, depth: int) -> int:
    """The most frames one experience message carries: a sender sends once ``2 * send_batch`` frames wait, and
    one step of its ``games`` makes at most ``depth + 1`` each (a finished episode's last frame and a new stack)."""
    return 2 * send_batch + games * (depth + 1)


def experience_layout(spec: dict, send_batch: int, framed: dict | None = None, games: int = 1) -> Layout:
    """``framed`` (the frame-stack fields, name -> (depth, frame shape)): frames once, for a sender of ``games``."""
    header = {"actor": 1, "env_steps": 1, "param_version": 1, "epsilon": 1, "steps_per_s": 1,
              "throttled_s": 1, "env_errors": 1, "started": 1, "torch_imported": 1, "final": 1, "episodes": 1, "ep_return": EPISODE_SLOTS, "ep_length": EPISODE_SLOTS}
    if not framed:
        return Layout(header, {**spec, "priority": ((), F32)}, send_batch)
    depth, frame_shape = next(iter(framed.values()))
    most = message_frames(send_batch, games, depth)
    return Layout({**header, "first_frame": 1, "oldest_frame": 1}, {**as_frame_ids(spec, framed), "priority": ((), F32)},
                  send_batch, counted={"frames": (frame_shape, np.dtype(np.uint8), most),
                                       "frame_games": ((), np.dtype(np.int32), most)})


def request_layout(max_share: int) -> Layout:
    header = {"kind": 1, "seq": 1, "want": 1, "consumed": 1, "train_steps": 1}
    fields = {"ids": ((), I64), "versions": ((), I64), "priority": ((), F32)}
    return Layout(header, fields, max_share)


# A dump goes out only every n_replay batches, so it reports many more episodes.
DUMP_EPISODE_SLOTS = 4096


def episode_slots(return_window: int) -> int:
    """Returns a reply to the learner holds: its return window's (``run.return_window``), at least
    :data:`EPISODE_SLOTS` and at most :data:`DUMP_EPISODE_SLOTS`. A reply counts every episode finished since the
    buffer's last and carries the latest returns of them (:class:`mpirl.actor_learner.episode_tally.EpisodeTally`),
    so the learner's window is the buffers' latest episodes however many finish between two replies."""
    return max(EPISODE_SLOTS, min(int(return_window), DUMP_EPISODE_SLOTS))


def _reply_header(episode_slots: int) -> dict:
    """``episodes``: finished since the buffer's last reply, every one; ``returns``: how many of the latest of
    them (those the learner's return window counts) ``ep_return`` holds."""
    return {"kind": 1, "seq": 1, "shard_size": 1, "shard_total": 1, "env_steps": 1, "inserted": 1,
            "episodes": 1, "returns": 1, "ep_return": episode_slots}


def sample_layout(spec: dict, max_share: int, framed: dict | None = None, cache: bool = False,
                  episodes: int = EPISODE_SLOTS) -> Layout:
    """``framed``: the frame-stack fields stored once; they travel as dumps carry them. ``cache``: with the learner's
    frame cache, ``frames`` holds only the frames it does not hold, and ``frame_slots`` (int32, one per sent frame)
    the cache slot each goes into, -1 for none (:mod:`mpirl.replay.frame_cache`). ``episodes``: the returns a reply
    holds (:func:`episode_slots`)."""
    fields = {"ids": ((), I64), "versions": ((), I64), "probs": ((), F64), "priority": ((), F32)}
    if not framed:
        return Layout(_reply_header(episodes), {**fields, **spec}, max_share)
    fields.update(_as_frame_indices(spec, framed))
    counted = _frames_field(framed, max_share)
    if cache:
        counted["frame_slots"] = ((), np.dtype(np.int32), counted["frames"][2])
    return Layout(_reply_header(episodes), fields, max_share, counted=counted)


def _as_frame_indices(spec: dict, framed: dict) -> dict:
    """The plain fields of ``spec``, then ``<name>_idx`` (depth,) int32 per frame-stack field."""
    fields = {name: v for name, v in spec.items() if name not in framed}
    fields.update({f"{name}_idx": ((depth,), np.dtype(np.int32)) for name, (depth, _) in framed.items()})
    return fields


def _frames_field(framed: dict, rows: int) -> dict:
    """The counted ``frames`` field, room for ``rows`` records sharing no frame (only what is filled is sent)."""
    frame_shape = next(iter(framed.values()))[1]
    return {"frames": (frame_shape, np.dtype(np.uint8), rows * sum(depth for depth, _ in framed.values()))}


def dump_layout(spec: dict, capacity: int, framed: dict | None = None) -> Layout:
    """``framed``: the frame-stack fields stored once, name -> (stack depth, frame shape)."""
    if not framed:
        return Layout(_reply_header(DUMP_EPISODE_SLOTS), {**spec, "priority": ((), F32)}, capacity)
    fields = {**_as_frame_indices(spec, framed), "priority": ((), F32)}
    return Layout(_reply_header(DUMP_EPISODE_SLOTS), fields, capacity, counted=_frames_field(framed, capacity))


def step_layout(step_spec: dict, games: int) -> Layout:
    header = {"seq": 1, "fresh": 1, "env_steps": 1, "steps_per_s": 1, "wait_s": 1, "latency_s": 1, "env_errors": 1}
    return Layout(header, step_spec, games)


def actions_layout(action_field: tuple, games: int) -> Layout:
    """An inference worker's answer: ``action_field`` is one game's action, ``(shape, dtype)``."""
    shape, dtype = action_field
    return Layout({"seq": 1, "stop": 1, "param_version": 1}, {"actions": (tuple(shape), np.dtype(dtype))}, games)
