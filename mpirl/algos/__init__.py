"""Algorithms: one folder each (``apex``, ``qmix``, ``distql``), chosen by ``[agent] algorithm``.

A folder holds:

* ``settings.py`` — config layer (standard library, :mod:`mpirl.domain` and, for the replay-based
  algorithms, :mod:`mpirl.replay_job`): ``SECTIONS``, the job-file sections the algorithm owns
  (``{"qmix": QmixConfig}``); ``USES``, the keys of the shared sections (``run``, ``topology``, ``agent``,
  ``env``, ``replay``, ``comm``, ``checkpoint``) it reads — a job that sets any other key of those sections
  is refused, naming the key (every algorithm reads ``log`` and run's name, seed and out_dir);
  ``check(cfg)``, its cross-field checks (no MPI, no torch); ``world_size(cfg)``, the ranks a job needs by
  default.
* ``algorithm.py`` — ``check(cfg, world_size, job_path) -> Checked`` (world size, environment, network,
  memory; no MPI), ``build_topology(world, cfg)``, ``ROLES`` (role name -> loop taking a
  :class:`~mpirl.roles.context.RoleContext` and returning the stop reason), ``rank_files(topo)`` (the
  per-rank HDF5 files ``run.h5`` links), ``describe(cfg, world_size, checked)`` (``validate``'s line).
* ``info.py`` — ``summarize(run_dir)`` and ``format_summary(summary)`` for ``mpirl info`` (no torch).
* its role loops and message layouts.

:mod:`mpirl.roles.job` wires any of them and never names one. Imports are lazy: a folder's
``__init__`` imports nothing, so a tabular job never imports torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from mpirl.config import ALGORITHMS


def algorithm(name: str) -> ModuleType:
    """The ``algorithm`` module of ``mpirl/algos/<name>/``."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return importlib.import_module(f"mpirl.algos.{name}.algorithm")


def info(name: str) -> ModuleType:
    """The ``info`` module (run summaries) of ``mpirl/algos/<name>/``."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return importlib.import_module(f"mpirl.algos.{name}.info")
