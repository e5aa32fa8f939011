"""The exchange family's messages (DistQL's), packed into byte buffers that are allocated once per peer.

* exchange (worker -> server, tag ``EXCHANGE``): the worker's counters in the header (its stats travel with
  its pairs, as actor stats do), the pairs it changed since its last send (flat index i32, Q f64, eta f64: 20 B
  a pair), and the episodes it finished since then (index, return, env return, length, epsilon).
* reply (server -> worker, tag ``REPLY``): the round, a stop flag, a checkpoint flag, and pairs in the same 20 B
  format (the whole table with ``mode = "all"``, the worker's own pairs with ``"partial"``).
* state (worker -> server, tag ``STATE``, after a reply with the checkpoint flag): what the worker needs to
  continue from there: its counters, its random generator's state, its environment's generator state (JSON
  text) and every pair it has seen (index, Q, eta; an unseen pair is always Q 0 and eta0).

Layout: the int64 header, the float64 header, then f64 columns, i64 columns and the i32 indices last, so every
column is aligned.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

EXCHANGE, REPLY, STATE = 41, 42, 43

# exchange header (int64): round, pairs, episodes, env_steps, episodes_done, last, torch_imported, bye
HEAD_I, HEAD_F = 8, 2  # ... and (float64) compute_s, wait_s
# After the reply to its last exchange a worker sends a bye: the header alone, with its final counters (the wait
# for that last reply included); the server answers a bye with nothing.
REPLY_HEAD = 4  # round, pairs, stop, checkpoint
# state header (int64): played, rounds, env_steps, last, pairs, rng words, env state bytes, unused; (float64)
# compute_s, wait_s
STATE_I, STATE_F = 8, 2
RNG_WORDS = 625  # random.Random's state: 624 words and the position


class Exchange(NamedTuple):
    round: int
    env_steps: int
    episodes_done: int
    last: bool
    torch_imported: bool
    bye: bool
    compute_s: float
    wait_s: float
    idx: np.ndarray
    q: np.ndarray
    eta: np.ndarray
    episode: np.ndarray  # the episodes' indices
    ret: np.ndarray  # returns as learned from (with the end penalty)
    env_ret: np.ndarray  # the env's own returns
    length: np.ndarray
    epsilon: np.ndarray


class Reply(NamedTuple):
    round: int
    stop: bool
    checkpoint: bool
    idx: np.ndarray
    q: np.ndarray
    eta: np.ndarray


class State(NamedTuple):
    played: int  # episodes played: the next is this one
    rounds: int
    env_steps: int
    last: bool  # its last episode was played
    compute_s: float
    wait_s: float
    rng: tuple  # random.Random().getstate()
    env_rng: str  # the environment's generator state as JSON
    idx: np.ndarray
    q: np.ndarray
    eta: np.ndarray


def exchange_nbytes(pairs: int, episodes: int) -> int:
    return 8 * HEAD_I + 8 * HEAD_F + 20 * pairs + 40 * episodes


def reply_nbytes(pairs: int) -> int:
    return 8 * REPLY_HEAD + 20 * pairs


ENV_STATE_BYTES = 4096  # room for an environment generator's state as JSON (PCG64's is about 150 bytes)


def state_nbytes(pairs: int) -> int:
    return 8 * (STATE_I + STATE_F + RNG_WORDS) + 20 * pairs + ENV_STATE_BYTES


def _views(buf: np.ndarray, offset: int, spec):
    out = []
    for dtype, n in spec:
        nbytes = np.dtype(dtype).itemsize * n
        out.append(buf[offset:offset + nbytes].view(dtype))
        offset += nbytes
    return out, offset


def pack_exchange(buf: np.ndarray, round_: int, env_steps: int, episodes_done: int, last: bool,
                  torch_imported: bool, compute_s: float, wait_s: float, idx, q, eta, episode, ret, env_ret,
                  length, epsilon, bye: bool = False) -> int:
    """Write an exchange into ``buf`` (uint8); returns its length in bytes."""
    n, m = len(idx), len(episode)
    (hi, hf, qv, ev, rv, erv, epsv, epv, lv, iv), end = _views(buf, 0, [
        (np.int64, HEAD_I), (np.float64, HEAD_F), (np.float64, n), (np.float64, n), (np.float64, m),
        (np.float64, m), (np.float64, m), (np.int64, m), (np.int64, m), (np.int32, n)])
    hi[:] = (round_, n, m, env_steps, episodes_done, int(last), int(torch_imported), int(bye))
    hf[:] = (compute_s, wait_s)
    qv[:], ev[:], rv[:], erv[:], epsv[:], epv[:], lv[:], iv[:] = q, eta, ret, env_ret, epsilon, episode, length, idx
    return end


def unpack_exchange(buf: np.ndarray) -> Exchange:
    """The exchange at the start of ``buf`` (its arrays are views into ``buf``)."""
    hi = buf[:8 * HEAD_I].view(np.int64)
    n, m = int(hi[1]), int(hi[2])
    (_, hf, q, eta, ret, env_ret, eps, episode, length, idx), _ = _views(buf, 0, [
        (np.int64, HEAD_I), (np.float64, HEAD_F), (np.float64, n), (np.float64, n), (np.float64, m),
        (np.float64, m), (np.float64, m), (np.int64, m), (np.int64, m), (np.int32, n)])
    return Exchange(int(hi[0]), int(hi[3]), int(hi[4]), bool(hi[5]), bool(hi[6]), bool(hi[7]), float(hf[0]), float(hf[1]),
                    idx, q, eta, episode, ret, env_ret, length, eps)


def pack_reply(buf: np.ndarray, round_: int, stop: bool, idx, q, eta, checkpoint: bool = False) -> int:
    n = len(idx)
    (h, qv, ev, iv), end = _views(buf, 0, [(np.int64, REPLY_HEAD), (np.float64, n), (np.float64, n),
                                           (np.int32, n)])
    h[:] = (round_, n, int(stop), int(checkpoint))
    qv[:], ev[:], iv[:] = q, eta, idx
    return end


def unpack_reply(buf: np.ndarray) -> Reply:
    h = buf[:8 * REPLY_HEAD].view(np.int64)
    n = int(h[1])
    (_, q, eta, idx), _ = _views(buf, 0, [(np.int64, REPLY_HEAD), (np.float64, n), (np.float64, n),
                                          (np.int32, n)])
    return Reply(int(h[0]), bool(h[2]), bool(h[3]), idx, q, eta)


def _state_spec(n: int, blob: int):
    return [(np.int64, STATE_I), (np.float64, STATE_F), (np.int64, RNG_WORDS), (np.float64, n), (np.float64, n),
            (np.int32, n), (np.uint8, blob)]


def pack_state(buf: np.ndarray, state: State) -> int:
    """Write a worker's state into ``buf`` (uint8); returns its length in bytes."""
    n, blob = len(state.idx), state.env_rng.encode()
    if len(blob) > ENV_STATE_BYTES:
        raise ValueError(f"the environment's generator state takes {len(blob)} bytes, more than {ENV_STATE_BYTES}")
    version, words, gauss = state.rng
    if version != 3 or gauss is not None or len(words) != RNG_WORDS:
        raise ValueError("a random.Random state of version 3 was expected")
    (hi, hf, rv, qv, ev, iv, bv), end = _views(buf, 0, _state_spec(n, len(blob)))
    hi[:] = (state.played, state.rounds, state.env_steps, int(state.last), n, RNG_WORDS, len(blob), 0)
    hf[:] = (state.compute_s, state.wait_s)
    rv[:], qv[:], ev[:], iv[:] = words, state.q, state.eta, state.idx
    bv[:] = np.frombuffer(blob, np.uint8)
    return end


def unpack_state(buf: np.ndarray) -> State:
    """The state at the start of ``buf`` (its arrays are views into ``buf``)."""
    hi = buf[:8 * STATE_I].view(np.int64)
    n, blob = int(hi[4]), int(hi[6])
    (_, hf, rv, q, eta, idx, bv), _ = _views(buf, 0, _state_spec(n, blob))
    return State(int(hi[0]), int(hi[1]), int(hi[2]), bool(hi[3]), float(hf[0]), float(hf[1]),
                 (3, tuple(rv.tolist()), None), bytes(bv).decode(), idx, q, eta)
