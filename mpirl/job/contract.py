"""The algorithm contract: what a folder of :mod:`mpirl.algos` provides, as types a checker holds it to.

An algorithm is three modules, each a :class:`typing.Protocol` here, and mypy (run by the test suite,
``tests/test_types.py``) checks every folder against them through :mod:`mpirl.registry`:

* ``settings.py`` — :class:`Settings`: the sections it owns, the shared keys it reads, its cross-field checks and
  its default world size (standard library and :mod:`mpirl.domain` only: the config layer imports it).
* ``algorithm.py`` — :class:`Algorithm`: its checks (world size, environment, network, memory: no MPI), its
  :class:`Layout` (which roles, which ranks, who talks to whom: data, before any communicator exists), the
  communicators, its role loops, its rank files, its validate line and its end-of-job summary.
* ``info.py`` — :class:`Info`: ``mpirl info``'s summary and ``mpirl watch``'s frame, from the HDF5 files alone.
* ``trained.py`` — :class:`Trained`: the trained policy a checkpoint holds, in one process without MPI (``mpirl play``,
  ``mpirl export``, ``mpirl.load_policy``).

It sits with the generic job (:mod:`mpirl.job`), below the algorithms: the shared layers and every algorithm import it,
and it imports no algorithm. Everything an algorithm declares is required: the shared wiring (:mod:`mpirl.job.wiring`, :mod:`mpirl.cli`) never
asks whether an algorithm has something, and never names one.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Protocol

from mpirl.comm.topology import Layout, Link, LinkKind  # noqa: F401 - the layout's data, part of the contract
from mpirl.job.memory import Estimate

if TYPE_CHECKING:
    from mpi4py import MPI

    from mpirl.comm.topology import Topology
    from mpirl.config import JobConfig
    import torch

    from mpirl.agents.trained_policy import TrainedPolicy
    from mpirl.job.context import RoleContext

class Checked(NamedTuple):
    """What an algorithm's checks found: the env's spaces (the algorithm's own record of them), the record spec
    its replay and messages use, the length of the parameter vector every broadcast carries, and each rank's
    memory estimate."""
    spaces: Any
    spec: dict
    n_params: int
    memory: Estimate


RoleLoop = Callable[["RoleContext"], "str | None"]  # a rank's loop; returns why it stopped


def lazy_loop(module: str, func: str, builder: object) -> RoleLoop:
    """The loop ``func(ctx, builder)`` of ``module``, imported when its rank starts (a rank imports only its own
    loop: a buffer rank never imports torch); ``builder``: the algorithm's, for its family's loop."""
    def run(ctx: "RoleContext") -> "str | None":
        return getattr(importlib.import_module(module), func)(ctx, builder)
    return run


class Settings(Protocol):
    """``mpirl/algos/<name>/settings.py``."""
    @property
    def SECTIONS(self) -> Mapping[str, type]:
        """The job-file sections it owns: ``{"<name>": ItsConfig}``."""

    @property
    def USES(self) -> Mapping[str, tuple[str, ...]]:
        """The keys of the shared sections it reads (a job that sets any other is refused)."""

    @property
    def MOVED(self) -> Mapping[str, str]:
        """Keys of the shared sections that moved into its own (``"agent.n_step": "<name>.n_step"``): a job that
        sets an old one is refused, saying where it went."""

    @property
    def DEFAULTS(self) -> Mapping[str, object]:
        """Its own defaults of keys of the shared sections it reads, where the shared one does not serve it
        (``{"agent.normalize_reward": True}``): a job that does not set the key gets this value."""

    def check(self, cfg: JobConfig) -> None:
        """Cross-field checks (no MPI, no torch); a ConfigError names the field and the fix."""

    def world_size(self, cfg: JobConfig) -> int:
        """The ranks the job needs by default (``mpirl launch`` without ``-n``)."""


class Algorithm(Protocol):
    """``mpirl/algos/<name>/algorithm.py``."""
    @property
    def ROLES(self) -> Mapping[str, RoleLoop]:
        """Role name (as the layout names it) -> its loop."""

    def check(self, cfg: JobConfig, world_size: int, job_path: str) -> Checked:
        """World size, environment, network and each role's memory (no MPI); ConfigError on a bad job."""

    def layout(self, cfg: JobConfig, world_size: int) -> Layout:
        """Which rank plays which role and who talks to whom (after :meth:`check` passed; no MPI)."""

    def build_topology(self, world: MPI.Comm, cfg: JobConfig) -> Topology:
        """The communicators of :meth:`layout` (collective over ``world``)."""

    def rank_files(self, topo: Topology) -> dict[str, str]:
        """The per-rank HDF5 files ``run.h5`` links: {link name: file name}."""

    def role_map(self, topo: Topology) -> str:
        """Who is who, for messages that name ranks: ``0 learner; 1 buffer, 2-3 actors of buffer 1``."""

    def describe(self, cfg: JobConfig, world_size: int, checked: Checked) -> str:
        """``mpirl validate``'s line."""

    def summary(self, run_dir: Path) -> str:
        """The end-of-job summary (what ``mpirl info`` prints)."""


class Info(Protocol):
    """``mpirl/algos/<name>/info.py``: reads the run's files only (no torch, no MPI)."""

    def summarize(self, run_dir: Path) -> dict[str, Any]:
        """The run's figures; ``status`` is among them."""

    def format_summary(self, s: dict[str, Any]) -> str:
        """``mpirl info``'s text."""

    def frame(self, s: dict[str, Any]) -> str:
        """One screen of ``mpirl watch``."""


class Trained(Protocol):
    """``mpirl/algos/<name>/trained.py``: no MPI."""

    def load_policy(self, cfg: JobConfig, run_dir: Path, checkpoint: Path | None, device: torch.device
                    ) -> TrainedPolicy:
        """The trained policy of the run ``run_dir`` of ``cfg`` on ``device``: from ``checkpoint`` (a file of the
        run's), or None: the newest it has (:func:`mpirl.job.checkpoint.chosen`); ``policy.source`` says which."""
