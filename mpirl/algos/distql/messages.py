"""DistQL's two messages, packed into byte buffers that are allocated once per peer.

* exchange (worker -> server, tag ``EXCHANGE``): the worker's counters in the header (its stats travel with
  its pairs, as actor stats do), the pairs it changed since its last send (flat index i32, Q f64, eta f64: 20 B
  a pair), and the episodes it finished since then (index, return, env return, length, epsilon).
* reply (server -> worker, tag ``REPLY``): the round, a stop flag, and pairs in the same 20 B format (the whole
  table with ``mode = "all"``, the worker's own pairs with ``"partial"``).

Layout: the int64 header, the float64 header, then f64 columns, i64 columns and the i32 indices last, so every
column is aligned.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

EXCHANGE, REPLY = 41, 42

# exchange header (int64): round, pairs, episodes, env_steps, episodes_done, last, torch_imported, bye
HEAD_I, HEAD_F = 8, 2  # ... and (float64) compute_s, wait_s
# After the reply to its last exchange a worker sends a bye: the header alone, with its final counters (the wait
# for that last reply included); the server answers a bye with nothing.
REPLY_HEAD = 4  # round, pairs, stop, unused


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
    idx: np.ndarray
    q: np.ndarray
    eta: np.ndarray


def exchange_nbytes(pairs: int, episodes: int) -> int:
    return 8 * HEAD_I + 8 * HEAD_F + 20 * pairs + 40 * episodes


def reply_nbytes(pairs: int) -> int:
    return 8 * REPLY_HEAD + 20 * pairs


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


def pack_reply(buf: np.ndarray, round_: int, stop: bool, idx, q, eta) -> int:
    n = len(idx)
    (h, qv, ev, iv), end = _views(buf, 0, [(np.int64, REPLY_HEAD), (np.float64, n), (np.float64, n),
                                           (np.int32, n)])
    h[:] = (round_, n, int(stop), 0)
    qv[:], ev[:], iv[:] = q, eta, idx
    return end


def unpack_reply(buf: np.ndarray) -> Reply:
    h = buf[:8 * REPLY_HEAD].view(np.int64)
    n = int(h[1])
    (_, q, eta, idx), _ = _views(buf, 0, [(np.int64, REPLY_HEAD), (np.float64, n), (np.float64, n),
                                          (np.int32, n)])
    return Reply(int(h[0]), bool(h[2]), idx, q, eta)
