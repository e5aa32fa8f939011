"""What an algorithm of the exchange family supplies, in one typed place.

In the exchange family each worker learns on its own environment and, every few episodes, exchanges what it
learned (the pairs of its table it changed) with a central server, which merges them into its own table and
answers with its values (DistQL's tabular Q-learning workers and Q-server). The family's loops
(:mod:`mpirl.exchange.server`, :mod:`mpirl.exchange.worker`) never name an algorithm: they ask the algorithm's
:class:`ExchangeBuilder` (``mpirl/algos/<name>/builder.py``) for

* the family's settings (:class:`ExchangeSettings`: episodes, the exchange's cadence and kind, evaluation);
* the environment a worker plays and the server evaluates on (:class:`Environment`);
* the worker's table (:class:`WorkerTable`) and the server's (:class:`ServerTable`);
* how a worker plays one episode with its table (its exploration, its rewards).

:func:`roles` maps the family's role names to its loops over one builder.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Callable, Generic, NamedTuple, Protocol, TypeVar

import numpy as np

from mpirl.comm.topology import LinkKind
from mpirl.config import JobConfig

from mpirl.job.contract import RoleLoop, lazy_loop

SERVER, WORKER = "server", "worker"  # the family's roles: rank 0 the server, the rest workers
LINK: LinkKind = "exchange"  # the link of each worker with the server (the server rank 0 of its communicator)


class ExchangeSettings(Protocol):
    """The fields of an algorithm's settings section that the family's loops read."""

    @property
    def episodes(self) -> int:
        """Episodes each worker plays."""

    @property
    def tau(self) -> int:
        """Episodes between a worker's exchanges (after its episodes 0, tau, 2 tau, ... and its last)."""

    @property
    def mode(self) -> str:
        """The server's reply: ``"all"``, every pair it holds; ``"partial"``, the pairs the worker sent."""

    @property
    def exchange(self) -> str:
        """``"async"``: each exchange merged and answered as it arrives; ``"sync"``: in rounds of every worker."""

    @property
    def variant(self) -> str:
        """The algorithm's learning rule, by name (the server's file records it)."""

    @property
    def worker_delay_us(self) -> list:
        """Microseconds added to every env step of each worker (one value for all, or one per worker)."""

    @property
    def eval_every(self) -> int:
        """The server's greedy evaluation every this many merges (0: only at the end)."""

    @property
    def eval_episodes(self) -> int:
        """Greedy episodes of an evaluation (0: none)."""

    @property
    def eval_max_steps(self) -> int:
        """Steps a greedy episode is cut at."""


class TableSpaces(Protocol):
    """The table's shape, as the algorithm's check found it (``ctx.spaces``)."""

    @property
    def n_states(self) -> int: ...

    @property
    def n_actions(self) -> int: ...


class Environment(Protocol):
    """An environment with integer states whose generator a checkpoint can save and continue."""

    def reset(self) -> int: ...

    def step(self, action: int) -> tuple[int, float, bool, bool]:
        """(next state, reward, terminated, truncated)."""

    def rng_state(self) -> str:
        """The generator's state as text ('' before the first reset)."""

    def set_rng_state(self, text: str) -> None: ...

    def close(self) -> None: ...


Pairs = tuple[np.ndarray, np.ndarray, np.ndarray]  # (flat index i32, Q f64, eta f64)


class WorkerTable(Protocol):
    """What the worker's loop uses of its table."""

    def changed_pairs(self) -> Pairs:
        """The pairs updated since the last call (sent in an exchange), which forgets them."""

    def seen_pairs(self) -> Pairs:
        """Every pair the worker has seen: its whole table (a checkpoint's state)."""

    def restore(self, idx: np.ndarray, q: np.ndarray, eta: np.ndarray) -> None:
        """The table :meth:`seen_pairs` described."""

    def apply_all(self, idx: np.ndarray, q: np.ndarray, eta: np.ndarray) -> None:
        """The server's whole table (a ``mode = "all"`` reply)."""

    def apply_partial(self, idx: np.ndarray, q: np.ndarray) -> None:
        """The server's values of the pairs this worker sent (a ``"partial"`` reply)."""


class ServerTable(Protocol):
    """What the server's loop (and its checkpoint) uses of its table."""

    q: np.ndarray
    eta: np.ndarray
    seen: np.ndarray
    merges: np.ndarray  # merges per pair

    def merge(self, idx: np.ndarray, q_i: np.ndarray, eta_i: np.ndarray) -> int:
        """One worker's pairs merged in; how many the server had never seen."""

    def restore(self, q: np.ndarray, eta: np.ndarray, seen: np.ndarray, merges: np.ndarray) -> None: ...

    def reply_all(self) -> Pairs:
        """Every pair the server holds."""

    def reply_partial(self, idx: np.ndarray) -> Pairs:
        """The pairs ``idx``."""

    def greedy(self, s: int, rng: np.random.Generator) -> int:
        """The best action of state ``s`` (an evaluation's)."""


class Played(NamedTuple):
    """One episode of a worker."""
    ret: float  # the return learned from (with the algorithm's reward shaping)
    env_ret: float  # the environment's own return
    length: int
    epsilon: float  # the exploration it played with


T = TypeVar("T", bound=WorkerTable)


class ExchangeBuilder(ABC, Generic[T]):
    """Everything an algorithm of the family supplies: one subclass per algorithm, made with no arguments; ``T``
    its worker's table."""

    @abstractmethod
    def settings(self, cfg: JobConfig) -> ExchangeSettings:
        """The job's section of the algorithm's settings."""

    @abstractmethod
    def make_env(self, cfg: JobConfig, seed: int) -> Environment:
        """The environment a worker learns on (and the server evaluates its table on), seeded with ``seed``."""

    @abstractmethod
    def make_worker_table(self, cfg: JobConfig, spaces: TableSpaces) -> T:
        """A worker's table, empty."""

    @abstractmethod
    def make_server_table(self, cfg: JobConfig, spaces: TableSpaces) -> ServerTable:
        """The server's table, empty (anything it compiles, compiled now, not mid-job)."""

    @abstractmethod
    def play_episode(self, cfg: JobConfig, env: Environment, table: T, episode: int, rng: random.Random,
                     each_step: Callable[[], None] | None) -> Played:
        """A worker's episode ``episode`` (from 0) of ``env``, learning into ``table`` as it plays, exploring with
        ``rng``; ``each_step`` called after every step (a worker's delay)."""


def roles(builder: ExchangeBuilder) -> dict[str, RoleLoop]:
    """Role name -> loop for an algorithm of the family, each over the algorithm's ``builder``; a loop's module is
    imported when its rank starts (a rank imports only its own loop)."""
    return {SERVER: lazy_loop("mpirl.exchange.server", "run_server", builder),
            WORKER: lazy_loop("mpirl.exchange.worker", "run_worker", builder)}
