"""Tabular Q-learning for DistQL: a worker's table and the Q-server's merge. No MPI, no torch.

The worker (``WorkerTable``) holds dense ``q[S, A]``, ``eta[S, A]`` and ``seen[S, A]`` and follows the authors'
code (``textbook=False``):

* argmax and max run over the actions a state has seen; a state with none gets a random action, and its max
  value is 0;
* a pair's first update starts from Q = r (then the update below applies);
* the update is Q <- Q + eta (r + gamma max_a' Q(s', a') - Q), bootstrapping through every episode end; then
  eta <- eta_decay * eta, so a pair's k-th update uses eta0 * eta_decay ** k (0.5 * 0.999 ** k);
* ``textbook=True``: a pair starts from Q = 0 and a termination (not a time limit) cuts the bootstrap.

The Q-server (``ServerTable``) merges (a numba loop, one pass over the pairs) the pairs a worker sends (DistQL Eq. 1), per pair i with (Q_i, eta_i):

* a pair it has never seen starts at (Q_c, eta_c) = (0, server_eta) (the source's 0.99), so its first merge
  gives Q_c = eta_i * Q_i (eta_c becomes eta_i, the weight eta_c^2 / eta_i = eta_i);
* eta_c <- min(eta_c, eta_i); Q_c <- (1 - eta_c^2 / eta_i) Q_c + (eta_c^2 / eta_i) Q_i; eta_c <- decay * eta_c.

Replies (``reply_all``, ``reply_partial``) are (flat index i32, Q f64, eta f64) triples; a worker applies them
with ``apply_all`` (overwrite the values of pairs it has seen, take value and eta for pairs it has not) or
``apply_partial`` (overwrite the values of the pairs it sent).
"""

from __future__ import annotations

import math
import random

import numpy as np

PAIR_BYTES = 4 + 8 + 8  # flat index i32, Q f64, eta f64


class WorkerTable:
    """A worker's table. Per step it is plain Python on flat lists (a state's row is a handful of numbers: numpy's
    per-call cost would be most of a step); ``q``, ``eta``, ``seen`` give numpy copies."""

    def __init__(self, n_states: int, n_actions: int, gamma: float = 0.9, eta0: float = 0.5,
                 eta_decay: float = 0.999, textbook: bool = False):
        self.shape = (int(n_states), int(n_actions))
        pairs = self.shape[0] * self.shape[1]
        self._q = [0.0] * pairs
        self._eta = [float(eta0)] * pairs
        self._seen = [False] * pairs
        self._changed: set[int] = set()  # updated since the last send
        self.gamma, self.eta_decay, self.textbook = float(gamma), float(eta_decay), bool(textbook)
        self.n_actions = int(n_actions)

    @property
    def q(self) -> np.ndarray:
        return np.array(self._q).reshape(self.shape)

    @property
    def eta(self) -> np.ndarray:
        return np.array(self._eta).reshape(self.shape)

    @property
    def seen(self) -> np.ndarray:
        return np.array(self._seen, bool).reshape(self.shape)

    def greedy(self, s: int, rng: random.Random) -> int:
        """The best seen action of ``s`` (the first of ties); a random one when ``s`` has seen none."""
        base, q, seen = s * self.n_actions, self._q, self._seen
        best, arg = 0.0, -1
        for a in range(self.n_actions):
            i = base + a
            if seen[i] and (arg < 0 or q[i] > best):
                best, arg = q[i], a
        return arg if arg >= 0 else rng.randrange(self.n_actions)

    def act(self, s: int, epsilon: float, rng: random.Random) -> int:
        if rng.random() < epsilon:
            return rng.randrange(self.n_actions)
        return self.greedy(s, rng)

    def value(self, s: int) -> float:
        """max over the seen actions of ``s``; 0 when it has seen none."""
        base, q, seen = s * self.n_actions, self._q, self._seen
        vals = [q[i] for i in range(base, base + self.n_actions) if seen[i]]
        return max(vals) if vals else 0.0

    def update(self, s: int, a: int, r: float, s2: int, terminated: bool) -> None:
        """One Q-learning update of (s, a) after reward ``r`` and next state ``s2``."""
        i = s * self.n_actions + a
        q = self._q
        if not self._seen[i]:
            self._seen[i] = True
            q[i] = 0.0 if self.textbook else r
        bootstrap = 0.0 if (self.textbook and terminated) else self.gamma * self.value(s2)
        eta = self._eta[i]
        q[i] += eta * (r + bootstrap - q[i])
        self._eta[i] = eta * self.eta_decay
        self._changed.add(i)

    def changed_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(flat index, Q, eta) of the pairs updated since the last call (in index order), which forgets them."""
        idx = sorted(self._changed)
        self._changed.clear()
        q, eta = self._q, self._eta
        return (np.array(idx, np.int32), np.array([q[i] for i in idx], np.float64),
                np.array([eta[i] for i in idx], np.float64))

    def seen_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(flat index, Q, eta) of every pair the worker has seen: with the update counts in eta, its whole table
        (an unseen pair always holds Q 0 and eta0)."""
        idx = np.flatnonzero(np.array(self._seen, bool)).astype(np.int32)
        q, eta = self._q, self._eta
        return idx, np.array([q[i] for i in idx.tolist()], np.float64), np.array([eta[i] for i in idx.tolist()])

    def restore(self, idx: np.ndarray, q: np.ndarray, eta: np.ndarray) -> None:
        """The table :meth:`seen_pairs` described, nothing changed since its last send."""
        mq, meta, seen = self._q, self._eta, self._seen
        for i, v, e in zip(idx.tolist(), q.tolist(), eta.tolist()):
            mq[i], meta[i], seen[i] = v, e, True
        self._changed.clear()

    def apply_all(self, idx: np.ndarray, q: np.ndarray, eta: np.ndarray) -> None:
        """The server's whole table: its values overwrite; pairs this worker has not seen take value and eta."""
        mq, meta, seen = self._q, self._eta, self._seen
        for i, v, e in zip(idx.tolist(), q.tolist(), eta.tolist()):
            mq[i] = v
            if not seen[i]:
                seen[i] = True
                meta[i] = e

    def apply_partial(self, idx: np.ndarray, q: np.ndarray) -> None:
        """The server's values of the pairs this worker sent."""
        mq = self._q
        for i, v in zip(idx.tolist(), q.tolist()):
            mq[i] = v


def play_episode(env, table: WorkerTable, epsilon: float, rng: random.Random, penalty: float = 0.0,
                 textbook: bool = False, each_step=None) -> tuple[float, float, int]:
    """One epsilon-greedy episode of ``env`` (``reset() -> s``, ``step(a) -> (s', r, terminated, truncated)``),
    updating ``table`` at every step; ``penalty`` is added to the last reward (the source: at any end; textbook:
    at a termination); ``each_step`` is called after every step (a worker's delay). Returns (the return learned
    from, the env's own return, the length)."""
    s, ret, env_ret, length = env.reset(), 0.0, 0.0, 0
    while True:
        a = table.act(s, epsilon, rng)
        s2, r, terminated, truncated = env.step(a)
        env_ret += r
        if terminated or (truncated and not textbook):
            r += penalty
        table.update(s, a, r, s2, terminated)
        ret += r
        length += 1
        if each_step is not None:
            each_step()
        if terminated or truncated:
            return ret, env_ret, length
        s = s2


class ServerTable:
    def __init__(self, n_states: int, n_actions: int, server_eta: float = 0.99, eta_decay: float = 0.999):
        self.shape = (int(n_states), int(n_actions))
        self.q = np.zeros(self.shape)
        self.eta = np.full(self.shape, float(server_eta))
        self.seen = np.zeros(self.shape, bool)
        self.merges = np.zeros(self.shape, np.int64)  # merges per pair
        self.eta_decay = float(eta_decay)
        self.merge(np.zeros(0, np.int32), np.zeros(0), np.zeros(0))  # load (or compile) the kernel now, not mid-job

    def merge(self, idx: np.ndarray, q_i: np.ndarray, eta_i: np.ndarray) -> int:
        """Merge one worker's pairs (each at most once); returns how many the server had never seen."""
        from mpirl.agents.tabular_merge import merge  # numba: on the server only, never on a worker
        return int(merge(self.q.ravel(), self.eta.ravel(), self.seen.ravel(), self.merges.ravel(),
                          np.asarray(idx, np.int32), np.asarray(q_i, np.float64), np.asarray(eta_i, np.float64),
                          self.eta_decay))

    def restore(self, q: np.ndarray, eta: np.ndarray, seen: np.ndarray, merges: np.ndarray) -> None:
        """The table a checkpoint saved."""
        self.q[...], self.eta[...], self.seen[...], self.merges[...] = q, eta, seen, merges

    def reply_all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every pair the server holds."""
        idx = np.flatnonzero(self.seen.ravel()).astype(np.int32)
        return idx, self.q.ravel()[idx], self.eta.ravel()[idx]

    def reply_partial(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pairs ``idx`` (those a worker sent)."""
        return idx, self.q.ravel()[idx], self.eta.ravel()[idx]

    def greedy(self, s: int, rng: np.random.Generator) -> int:
        seen = self.seen[s]
        if not seen.any():
            return int(rng.integers(self.shape[1]))
        return int(np.argmax(np.where(seen, self.q[s], -np.inf)))


def epsilon_at(episode: int, epsilon: float = 0.1, decay: float = 0.999) -> float:
    """A worker's exploration in its episode ``episode`` (from 0)."""
    return epsilon * decay ** episode


def end_penalty(env_id: str, penalty: float) -> float:
    """The penalty added to an episode's last reward: ``penalty``, or the source's (-200 on CartPole) when nan."""
    if not math.isnan(penalty):
        return float(penalty)
    return -200.0 if env_id.split(":", 1)[-1].startswith("CartPole") else 0.0
