"""What a worker and the parameter server say to each other (the family's ``exchange`` = ``"async"`` or ``"sync"``).

A worker's message: a header of 16 int64 and 8 float64, the episodes it finished since its last message (return
and length, float64, up to ``max_episodes``), then its gradient (float32, ``n_params``; absent from a hello or a
goodbye). The server's reply: a header of 8 int64, then the parameters (float32, ``n_params``) of the version it
names. Sizes are fixed by the job; a message is sent at its used length and received into a buffer of the largest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from mpirl.config import JobConfig
    from mpirl.gradients.builder import GradientSettings

GRADIENT, REPLY = 31, 32  # tags on the gradients link's communicator
HELLO, GRAD, BYE = 0, 1, 2  # what a message is
N_INT, N_FLOAT = 16, 8
HEAD = 8 * (N_INT + N_FLOAT)
STATS = ("loss", "policy_loss", "value_loss", "entropy", "grad_norm", "clip_fraction", "approx_kl", "compute_s")


class Message(NamedTuple):
    kind: int
    version: int  # of the parameters the gradient was computed on
    rollout: int  # the worker's rollouts so far (this one included)
    env_steps: int  # the worker's, in all
    episodes: int  # the worker's finished episodes, in all
    stats: dict  # STATS of this gradient
    returns: np.ndarray  # float64: the episodes finished since the last message
    lengths: np.ndarray
    grad: np.ndarray  # float32 view into the inbox (empty for a hello or a goodbye)


class Reply(NamedTuple):
    version: int
    stop: bool
    dropped: bool  # the gradient answered was not applied
    env_steps: int  # a hello's answer: the worker's env steps at the checkpoint resumed from
    episodes: int
    params: np.ndarray  # float32 view


def max_episodes(cfg: JobConfig, settings: GradientSettings) -> int:
    """Episodes one message may carry: every game ending at every step of a rollout (``settings``: the family's
    section of ``cfg``)."""
    return cfg.env.envs_per_actor * settings.unroll


def message_nbytes(n_params: int, max_episodes: int) -> int:
    return HEAD + 16 * max_episodes + 4 * n_params


def reply_nbytes(n_params: int) -> int:
    return 8 * 8 + 4 * n_params


def pack(out: np.ndarray, kind: int, version: int, rollout: int, env_steps: int, episodes: int, stats: dict,
         returns: np.ndarray, lengths: np.ndarray, grad: np.ndarray | None) -> int:
    """Write a message into ``out`` (uint8); its length in bytes."""
    k = len(returns)
    ints = out[:8 * N_INT].view(np.int64)
    ints[:] = 0
    ints[:6] = (kind, version, rollout, env_steps, episodes, k)
    floats = out[8 * N_INT:HEAD].view(np.float64)
    floats[:] = [stats.get(s, 0.0) for s in STATS]
    eps = out[HEAD:HEAD + 16 * k].view(np.float64)
    eps[:k], eps[k:] = returns, lengths
    end = HEAD + 16 * k
    if grad is None:
        return end
    n = 4 * len(grad)
    out[end:end + n].view(np.float32)[:] = grad
    return end + n


def unpack(buf: np.ndarray, nbytes: int) -> Message:
    ints = buf[:8 * N_INT].view(np.int64)
    kind, version, rollout, env_steps, episodes, k = (int(x) for x in ints[:6])
    floats = buf[8 * N_INT:HEAD].view(np.float64)
    eps = buf[HEAD:HEAD + 16 * k].view(np.float64)
    end = HEAD + 16 * k
    return Message(kind, version, rollout, env_steps, episodes, dict(zip(STATS, floats.tolist())), eps[:k].copy(),
                   eps[k:].copy(), buf[end:nbytes].view(np.float32))


def pack_reply(out: np.ndarray, version: int, stop: bool, dropped: bool, n_params: int, env_steps: int = 0,
               episodes: int = 0) -> tuple[int, np.ndarray]:
    """Write a reply's header into ``out`` (uint8): the reply's length in bytes, and where its ``n_params``
    parameters go (a float32 view the server writes them into, straight from its model)."""
    ints = out[:64].view(np.int64)
    ints[:] = (version, int(stop), int(dropped), env_steps, episodes, 0, 0, 0)
    return 64 + 4 * n_params, reply_params(out, n_params)


def reply_params(buf: np.ndarray, n_params: int) -> np.ndarray:
    return buf[64:64 + 4 * n_params].view(np.float32)


def unpack_reply(buf: np.ndarray, n_params: int) -> Reply:
    v, stop, dropped, env_steps, episodes = (int(x) for x in buf[:40].view(np.int64))
    return Reply(v, bool(stop), bool(dropped), env_steps, episodes, reply_params(buf, n_params))
