"""What an algorithm of the gradient family supplies, in one typed place.

An algorithm (today A3C, with DPPO's and DD-PPO's exchanges) is one :class:`GradientBuilder`
(``mpirl/algos/<name>/builder.py``); the family's loops (the parameter server :mod:`mpirl.gradients.server`, the
workers :mod:`mpirl.gradients.worker` and their link :mod:`mpirl.gradients.exchange`) ask it for their parts and
never name an algorithm:

* its settings: the section of the job file the loops read (:class:`GradientSettings`);
* the model a worker plays and computes gradients with, and that whoever applies gradients steps
  (:class:`GradientModel`), and the rollout a worker fills (:class:`GradientRollout`);
* the gradients a rollout gives (:meth:`GradientBuilder.passes`: one, or passes of minibatches);
* the final policy's test round (:meth:`GradientBuilder.play_test`).

A rank builds only what its role needs: a builder imports an algorithm's torch parts inside the method that makes
them, so checking a job never imports torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import numpy as np

from mpirl.config import JobConfig
from mpirl.job.context import RoleContext

if TYPE_CHECKING:  # (the model is torch's: checking a job imports this module)
    import torch


class GradientSettings(Protocol):
    """The family's section of the job file: what the loops read of it."""

    exchange: str  # "async" (a parameter server), "sync" (its rounds) or "allreduce" (the workers among themselves)
    loss: str  # the loss's name, for the workers' files
    unroll: int  # steps of each of a worker's games in one rollout
    max_staleness: int  # async: updates a gradient may be behind and still be applied
    stragglers: int  # sync: the gradients a round does not wait for
    sync_frac: float  # allreduce: the share of finished workers that preempts the others' rollouts
    check_every: int  # allreduce: updates between checks that every rank holds the same parameters (0: never)
    worker_delay_us: list  # microseconds added to every env step: one value for all workers, or one per worker
    reward_scale: float  # each reward times this in the loss (episode returns stay the environment's)
    test_episodes: int  # games of the final policy's test round (0: none)

    @property
    def min_steps(self) -> int:
        """Steps of a rollout a preempted worker keeps at least (allreduce)."""


class GradientRollout(Protocol):
    """Preallocated time-major ``[T, E]`` arrays of one rollout of a worker's ``E`` games; ``steps`` of them
    filled (a preempted rollout has fewer). The worker writes each step's row; ``bootstrap`` is the value of the
    observations after the last; ``first`` (a recurrent policy's, else None): where an episode starts."""

    T: int
    E: int
    steps: int
    first: np.ndarray | None
    obs: np.ndarray
    action: np.ndarray
    logp: np.ndarray
    value: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_value: np.ndarray
    bootstrap: np.ndarray


class Prepared(Protocol):
    """A rollout ready for its gradients (advantages and returns computed): ``n`` samples."""

    n: int


class GradientModel(Protocol):
    """The network a worker plays with and computes gradients with, and whoever applies gradients (the server,
    or every worker under allreduce) steps with its optimizer; parameters and gradients travel as flat float32
    vectors of ``n_params``."""

    n_params: int
    device: torch.device
    fault: str  # why the last gradient was refused (a loss or a norm that is not finite)

    def act(self, obs: np.ndarray, rng: np.random.Generator, starts: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions sampled for ``obs`` (one row per game), their log-probabilities and the values; ``starts``: the
        games whose episode begins with this observation (a recurrent policy zeroes their state first)."""

    def log_prob(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """The log-probabilities of ``actions`` (a forced action the games played instead of the sampled one)."""

    def values(self, obs: np.ndarray, rows: np.ndarray | None = None, starts: np.ndarray | None = None) -> np.ndarray:
        """The values of ``obs`` (a recurrent policy's: from the state of the games ``rows``, zeroed where
        ``starts``, not moved)."""

    def begin(self, rollout: Any) -> None:
        """A rollout starts (a recurrent policy records its core's state there)."""

    def observe(self, obs: np.ndarray) -> np.ndarray:
        """Raw observations to act on: counted for the job's statistics, returned normalised (or as they are)."""

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """Raw observations normalised with the statistics as they are, not counted."""

    def rewards(self, reward: np.ndarray, ended: np.ndarray) -> np.ndarray:
        """Rewards as the loss takes them (the return's spread counted); ``ended``: the games whose episode ended."""

    def restart(self) -> None:
        """The games were rebuilt: every game's running discounted return (reward scaling's) begins again."""

    def at(self, progress: float) -> None:
        """The scheduled settings (learning rate, loss coefficients) where the run is, in ``agent.schedule_unit``."""

    def fold(self, grad: np.ndarray) -> None:
        """The statistics' moments a gradient carries, folded in without applying the gradient."""

    def prepare(self, rollout: Any) -> Prepared:
        """The :class:`GradientRollout` its builder made, filled, with its advantages and returns."""

    def gradient(self, prepared: Any, idx: np.ndarray | None, out: np.ndarray) -> dict[str, float] | None:
        """The loss's flat gradient over the samples ``idx`` (None: all) of what :meth:`prepare` gave, written
        into ``out``: its statistics (:data:`mpirl.gradients.messages.STATS`), or None (and :attr:`fault` says
        why) when it is not finite."""

    def apply(self, grad: np.ndarray, scale: float = 1.0) -> float:
        """Step the optimizer with ``grad`` times ``scale`` (a sum of gradients into their mean) and fold the
        moments it carries, unscaled: the norm it was clipped from."""

    def load(self, flat: np.ndarray) -> None:
        """The parameters, as one flat vector."""

    def flat_params(self, out: np.ndarray | None = None) -> np.ndarray:
        """The parameters as one float32 vector: a new one, or written into ``out`` (and returned)."""

    def state(self) -> dict:
        """The network and optimizer, for a checkpoint."""

    def restore(self, st: dict) -> None:
        """From :meth:`state`'s dict."""


class GradientBuilder(ABC):
    """Everything an algorithm of the family supplies: one subclass per algorithm, made with no arguments."""

    @abstractmethod
    def settings(self, cfg: JobConfig) -> GradientSettings:
        """The job's section of the family's settings."""

    @abstractmethod
    def make_model(self, ctx: RoleContext, optimizer: bool) -> GradientModel:
        """The rank's model on ``agent.device``, seeded by ``run.seed`` (every rank the same initial parameters);
        ``optimizer``: the rank applies gradients."""

    @abstractmethod
    def make_rollout(self, ctx: RoleContext) -> GradientRollout:
        """An empty rollout of the family's ``unroll`` steps of the worker's ``env.envs_per_actor`` games."""

    @abstractmethod
    def passes(self, cfg: JobConfig, n: int, rng: np.random.Generator) -> Iterator[list[np.ndarray | None]]:
        """The gradients a rollout of ``n`` samples gives, pass by pass: each pass the samples of each of its
        gradients (None: all of them); a pass is drawn (from ``rng``) when the worker comes to it."""

    @abstractmethod
    def play_test(self, model: GradientModel, ctx: RoleContext, episodes: int, seed: int) -> dict:
        """``episodes`` games of ``model``'s policy on the job's environment: the columns of a ``test`` row
        (:data:`mpirl.agents.test_play.TEST_COLUMNS`) but its time, train steps, env steps and seconds."""
