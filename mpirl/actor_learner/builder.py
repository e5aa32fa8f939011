"""What an algorithm of the actor → buffer → learner family supplies, in one typed place.

An algorithm (Ape-X, QMIX, IMPALA) is one :class:`ActorLearnerBuilder` (``mpirl/algos/<name>/builder.py``); the
family's loops (:mod:`mpirl.actor_learner.actor`, :mod:`~mpirl.actor_learner.env_actor`,
:mod:`~mpirl.actor_learner.worker`, :mod:`~mpirl.actor_learner.replay_buffer`, :mod:`~mpirl.actor_learner.learner`)
ask it for their parts and never name an algorithm:

* acting: the rows a game step gives and the actions' shape (the inference workers' messages), the games
  (:class:`Games`) and the decisions (:class:`Deciding`): the same decisions on an actor or on a worker;
* the buffer: what it serves the learner from (:meth:`ActorLearnerBuilder.make_server`: a replay shard or a relay
  of the algorithm's records, or a queue), how long a sender holds records, how many a message carries;
* the learner: its training (:class:`~mpirl.actor_learner.learner_algorithm.LearnerAlgorithm`).

A rank builds only what its role needs: a builder imports an algorithm's torch parts inside the method that makes
them, so a buffer rank never imports torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from mpirl.actor_learner.buffer_servers import Buffer, Server
from mpirl.actor_learner.experience import Staging
from mpirl.config import JobConfig
from mpirl.envs.outcomes import Outcome
from mpirl.job.context import RoleContext

if TYPE_CHECKING:  # (the learner's side imports torch: a buffer rank imports this module)
    from mpirl.actor_learner.learner_algorithm import AlgorithmFactory
    from mpirl.comm.topology import Topology
    from mpirl.replay.frame_stream import FrameStream


class Games(Protocol):
    """An actor's environments, stepped with the actions they are given; a failing game is rebuilt."""

    env_errors: int  # games that raised, counted since the start

    def start(self) -> Outcome:
        """Build and reset the games: the observations to act on."""

    def step(self, actions: np.ndarray) -> Outcome:
        """One step of every game with ``actions`` (one row per game): what it led to."""

    def close(self) -> None: ...


class Policy(Protocol):
    """The acting copy of the network."""

    def load_flat(self, flat: np.ndarray) -> None:
        """The parameters of a broadcast, as one flat vector."""


class Budget(Protocol):
    """A sender's flow control: over it, the sender holds back."""

    def over(self, sent: int, version: int) -> bool:
        """True while ``sent`` records at parameter ``version`` are more than its share."""

    def close(self) -> None:
        """The sender is done: whatever the budget holds open (a credit line) ends."""


class Deciding(Protocol):
    """The decisions for the games of one actor or of the several actors a worker serves (actor ``a``: its index
    among them): the network, exploration, and what the outcomes make (n-step transitions, trajectories, whole
    episodes) staged for the buffer."""

    @property
    def policy(self) -> Policy:
        """The acting copy of the network."""

    @property
    def staging(self) -> Staging:
        """Records made, waiting to be sent."""

    @property
    def episodes(self) -> deque:
        """Finished episodes, (return, length), waiting to be reported."""

    @property
    def env_steps(self) -> np.ndarray:
        """Each actor's env steps (a resumed worker sets them)."""

    @property
    def frames(self) -> FrameStream | None:
        """With frames once: the stream that numbers each new frame once."""

    @property
    def framed(self) -> dict:
        """The frame-stack fields stored once (empty without frames once)."""

    @property
    def send_batch(self) -> int:
        """Records a message carries."""

    @property
    def actors(self) -> int:
        """The actors decided for."""

    def epsilon(self, a: int = 0) -> float:
        """Actor ``a``'s exploration, for its rows (NaN where the policy explores by sampling)."""

    def budget(self, topo: Topology) -> Budget:
        """The sender's flow control: the insert budget, or a queue's window."""

    def observe(self, a: int, outcome: Outcome) -> None:
        """What actor ``a``'s last actions led to: the records it completes are staged."""

    def decide(self, actors: list[int], outcomes: list[Outcome]) -> np.ndarray:
        """The next actions of the listed actors' games, one forward pass."""

    def take(self, rows: int) -> tuple[dict, np.ndarray]:
        """The first ``rows`` staged records (views, valid until :meth:`drop`) and their initial priorities."""

    def drop(self, rows: int) -> None:
        """Forget the first ``rows`` staged records (sent)."""

    def oldest_frame(self, rows: int) -> int:
        """With frames once: the oldest frame a later message may refer to once ``rows`` staged rows are sent."""

    def holds(self, a: int) -> bool:
        """True while actor ``a`` may not act with the parameters loaded (a synchronous round it has finished)."""


class ActorLearnerBuilder(ABC):
    """Everything an algorithm of the family supplies: one subclass per algorithm, made with no arguments."""

    # -- acting ------------------------------------------------------------------------------------------------
    @abstractmethod
    def step_spec(self, spaces: Any) -> dict:
        """The rows a game step gives its decisions (an inference worker's step message): field -> (shape,
        dtype) per game."""

    @abstractmethod
    def action_field(self, spaces: Any) -> tuple[tuple[int, ...], np.dtype]:
        """One game's action as it is stored and sent: ``(shape, dtype)`` (``((), int64)`` for one discrete
        action, ``((agents,), int64)`` for a team, float32 of the space's shape for continuous actions)."""

    @abstractmethod
    def make_games(self, ctx: RoleContext, label: str) -> Games:
        """An actor's games; ``label`` names the actor in messages."""

    @abstractmethod
    def make_deciding(self, ctx: RoleContext, actors: list[int]) -> Deciding:
        """The decisions for ``actors`` (world ranks; an actor without a worker: itself)."""

    # -- the buffer --------------------------------------------------------------------------------------------
    @abstractmethod
    def make_server(self, buffer: Buffer, share: int) -> Server:
        """What a buffer serves the learner from, for requests of up to ``share`` records
        (:func:`mpirl.actor_learner.buffer_servers.placement_server` over the algorithm's replay memory, or a
        server of its own)."""

    def sender_lag(self, cfg: JobConfig) -> int:
        """Steps a sender holds a game's records before it can send them (an n-step window): its frames wait that
        much longer in the sender's window on the buffer. None by default."""
        return 0

    def message_rows(self, cfg: JobConfig, games: int) -> int:
        """Records one sender's message holds at most (``games``: the most games one sender steps):
        ``comm.send_batch`` by default."""
        return cfg.comm.send_batch

    # -- the learner -------------------------------------------------------------------------------------------
    @abstractmethod
    def training(self) -> AlgorithmFactory:
        """The learner's side: the :class:`~mpirl.actor_learner.learner_algorithm.LearnerAlgorithm` the loop makes
        (imported here, on the learner's rank only)."""


class VectorGamesBuilder(ActorLearnerBuilder):
    """A builder whose actors play one agent's games in a vector env (:class:`mpirl.envs.games.VectorGames`):
    Ape-X's and IMPALA's."""

    def step_spec(self, spaces: Any) -> dict:
        from mpirl.envs.games import step_spec
        return step_spec(spaces)

    def action_field(self, spaces: Any) -> tuple[tuple[int, ...], np.dtype]:
        from mpirl.envs.games import action_field
        return action_field(spaces)

    def make_games(self, ctx: RoleContext, label: str) -> Games:
        from mpirl.envs.games import VectorGames
        return VectorGames(ctx.cfg, ctx.spaces, ctx.seed(), label)
