"""The messages of the job, as layouts over the algorithm's transition spec.

* experience (actor -> buffer, ``TAG_EXPERIENCE``): a batch of transitions with the
  actor's initial priorities; the header carries the actor's counters and the
  episodes it finished since its last message; ``final=1`` is its last message.
* request (learner -> buffer, ``TAG_REQUEST``): ``kind`` SAMPLE/DUMP/BYE, how many
  samples it wants, and the priorities of an earlier batch from this buffer
  (ids, versions, |TD|).
* sample (buffer -> learner, ``TAG_REPLY``): a prioritized batch with ids, slot
  versions, sampling probabilities and raw priorities; the header carries the
  shard's size and total priority and the group's counters and finished episodes.
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

# Finished episodes reported per message; more wait for the next message.
EPISODE_SLOTS = 32

F32, F64, I64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)


def experience_layout(spec: dict, send_batch: int) -> Layout:
    header = {"actor": 1, "env_steps": 1, "param_version": 1, "epsilon": 1, "steps_per_s": 1,
              "throttled_s": 1, "env_errors": 1, "final": 1, "episodes": 1, "ep_return": EPISODE_SLOTS, "ep_length": EPISODE_SLOTS}
    return Layout(header, {**spec, "priority": ((), F32)}, send_batch)


def request_layout(max_share: int) -> Layout:
    header = {"kind": 1, "seq": 1, "want": 1, "consumed": 1, "train_steps": 1}
    fields = {"ids": ((), I64), "versions": ((), I64), "priority": ((), F32)}
    return Layout(header, fields, max_share)


# A dump goes out only every n_replay batches, so it reports many more episodes.
DUMP_EPISODE_SLOTS = 4096


def _reply_header(episode_slots: int) -> dict:
    return {"kind": 1, "seq": 1, "shard_size": 1, "shard_total": 1, "env_steps": 1, "inserted": 1,
            "episodes": 1, "ep_return": episode_slots}


def sample_layout(spec: dict, max_share: int) -> Layout:
    fields = {"ids": ((), I64), "versions": ((), I64), "probs": ((), F64), "priority": ((), F32), **spec}
    return Layout(_reply_header(EPISODE_SLOTS), fields, max_share)


def dump_layout(spec: dict, capacity: int, framed: dict | None = None) -> Layout:
    """``framed``: the frame-stack fields stored once, name -> (stack depth, frame shape)."""
    if not framed:
        return Layout(_reply_header(DUMP_EPISODE_SLOTS), {**spec, "priority": ((), F32)}, capacity)
    fields = {name: v for name, v in spec.items() if name not in framed}
    fields.update({f"{name}_idx": ((depth,), np.dtype(np.int32)) for name, (depth, _) in framed.items()})
    fields["priority"] = ((), F32)
    frame_shape = next(iter(framed.values()))[1]
    # Room for the worst case, no frame shared; only the bytes a dump fills are touched or sent.
    most = capacity * sum(depth for depth, _ in framed.values())
    return Layout(_reply_header(DUMP_EPISODE_SLOTS), fields, capacity,
                  counted={"frames": (frame_shape, np.dtype(np.uint8), most)})


def step_layout(step_spec: dict, games: int) -> Layout:
    header = {"seq": 1, "fresh": 1, "env_steps": 1, "steps_per_s": 1, "wait_s": 1, "latency_s": 1, "env_errors": 1}
    return Layout(header, step_spec, games)


def actions_layout(action_shape: tuple, games: int) -> Layout:
    return Layout({"seq": 1, "stop": 1, "param_version": 1}, {"actions": (tuple(action_shape), I64)}, games)
