"""DistQL's settings: the ``[distql]`` section. Of the shared sections it reads ``env.id`` and
``env.max_episode_steps``, run's stop conditions besides ``distql.episodes`` (``wall_seconds``, ``env_steps``
over all workers, ``target_return`` over the last ``return_window`` episodes of all workers) and the checkpoint
cadence (and run's name, seed and out_dir, as every algorithm).

The defaults are the source code's (DistQL §3-5 and its authors' code), which differ from the paper's text
in places; ``variant = "textbook"`` is plain Q-learning instead (see mpirl/agents/tabular.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpirl.domain import ConfigError, Domain, setting

MAX_TABLE = 10**8  # state-action pairs a table may have (a dense f64 Q, f64 eta, bool seen: ~1.7 GB)


@dataclass
class DistqlConfig:
    # Worker ranks (rank 0 is the Q-server); 0: every rank after the server.
    workers: int = setting(0, ge=0, le=1_000_000, why="0: every rank after the server")
    episodes: int = setting(2000, ge=1, le=10**9, why="episodes each worker plays")
    # A worker sends the pairs it changed after its episodes 0, tau, 2 tau, ... (and after its last).
    tau: int = setting(10, ge=1, le=10**9, why="episodes between a worker's exchanges")
    # The server's reply: "all", every pair it holds; "partial", only the pairs the worker sent.
    mode: str = setting("all", choices=("all", "partial"))
    # "async": the server merges each worker's message as it arrives and answers it; "sync": it waits for
    # round k of every worker, merges them in rank order and answers all.
    exchange: str = setting("async", choices=("async", "sync"))
    # "source": the authors' code (first update starts from Q = r, bootstrap through every episode end, the
    # end penalty at any end); "textbook": zero initial values, no bootstrap past a termination, the penalty
    # on termination only.
    variant: str = setting("source", choices=("source", "textbook"))
    gamma: float = setting(0.9, ge=0, le=1)
    # A pair's learning rate on a worker: eta0 * eta_decay ** (its updates so far).
    eta0: float = setting(0.5, gt=0, le=1)
    eta_decay: float = setting(0.999, gt=0, le=1)
    # The learning rate a pair the server has never seen starts with (the source's 0.99).
    server_eta: float = setting(0.99, gt=0, le=1)
    # Exploration in episode j of a worker: epsilon * epsilon_decay ** j.
    epsilon: float = setting(0.1, gt=0, le=1)
    epsilon_decay: float = setting(0.999, gt=0, le=1)
    # Added to the last reward of an episode; nan: the source's choice for the env (-200 on CartPole, else 0).
    end_penalty: float = setting(math.nan, nan=True, ge=-1e9, le=1e9, why="nan: -200 on CartPole, else 0")
    # Bins of CartPole's four observations (position, velocity, angle, angular velocity); the paper's 8, 8, 8,
    # 12 (the authors' code used 10 for the last).
    bins: list = setting([8, 8, 8, 12], items=Domain(ge=1, le=1_000_000), why="4 positive bin counts")
    # Microseconds added to every env step of each worker (one value for all, or one per worker): slower
    # workers, the case for asynchrony.
    worker_delay_us: list = setting([0], items=Domain(ge=0, le=10**9), why="one for all, or one per worker")
    # The server plays eval_episodes greedy episodes with its table every eval_every merges (0: never) and at
    # the end, as the source's reference learner did.
    eval_every: int = setting(0, ge=0, le=10**9, why="0: only at the end")
    eval_episodes: int = setting(20, ge=0, le=10**6, why="0: no evaluation")
    # A greedy episode that lasts this long is cut (a greedy table can loop forever where the env sets no limit);
    # the eval rows count the cut ones.
    eval_max_steps: int = setting(10_000, ge=1, le=10**9, why="steps of one greedy episode")


SECTIONS = {"distql": DistqlConfig}

MOVED: dict[str, str] = {}  # no key of a shared section has moved into [distql]

DEFAULTS: dict[str, object] = {}  # the shared sections' defaults serve it

USES = {"env": ("id", "max_episode_steps"),
        "run": ("wall_seconds", "env_steps", "target_return", "return_window"),
        "checkpoint": ("every_seconds", "keep")}


def world_size(cfg) -> int:
    """The server and its workers (8 by default, the paper's largest setting)."""
    return 1 + (cfg.distql.workers or 8)


def check(cfg) -> None:
    """DistQL's cross-field checks (no MPI, no environment)."""
    d = cfg.distql
    if len(d.bins) != 4:
        raise ConfigError("distql.bins", f"must be 4 bin counts (CartPole's position, velocity, angle, angular "
                                         f"velocity), got {len(d.bins)}: {d.bins}")
    # worker_delay_us against the number of workers: algorithm.world_check (it knows the world size)
