"""Algorithms: one folder each (``apex``, ``qmix``, ``impala``, ``distql``, ``a3c``), chosen by ``[agent] algorithm``.

A folder holds:

* ``settings.py`` — config layer (standard library, :mod:`mpirl.domain` and, for the replay-based
  algorithms, :mod:`mpirl.replay_job`): ``SECTIONS``, the job-file sections the algorithm owns
  (``{"qmix": QmixConfig}``); ``USES``, the keys of the shared sections (``run``, ``topology``, ``agent``,
  ``env``, ``replay``, ``comm``, ``checkpoint``) it reads — a job that sets any other key of those sections
  is refused, naming the key (every algorithm reads ``log`` and run's name, seed and out_dir);
  ``check(cfg)``, its cross-field checks (no MPI, no torch); ``world_size(cfg)``, the ranks a job needs by
  default.
* ``algorithm.py`` — :class:`~mpirl.job.contract.Algorithm`: ``check(cfg, world_size, job_path) -> Checked``
  (world size, environment, network, memory; no MPI), ``layout(cfg, world_size)`` (roles, ranks and links as
  data), ``build_topology(world, cfg)``, ``ROLES`` (role name -> loop taking a
  :class:`~mpirl.job.context.RoleContext` and returning the stop reason), ``rank_files(topo)`` (the
  per-rank HDF5 files ``run.h5`` links), ``role_map(topo)``, ``describe(cfg, world_size, checked)``
  (``validate``'s line), ``summary(run_dir)``.
* ``info.py`` — :class:`~mpirl.job.contract.Info`: ``summarize(run_dir)``, ``format_summary(summary)`` for
  ``mpirl info`` and ``frame(summary)`` for ``mpirl watch`` (no torch).
* its role loops and message layouts.

The contract is typed (:mod:`mpirl.job.contract`) and checked by mypy in the test suite through ``REGISTRY``
below: adding an algorithm is adding its folder and its line there.

:mod:`mpirl.job.wiring` wires any of them and never names one. Imports are lazy: a folder's
``__init__`` imports nothing, so a tabular job never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from mpirl.job.contract import Algorithm, Info
from mpirl.config import ALGORITHMS


def algorithm(name: str) -> Algorithm:
    """The ``algorithm`` module of ``mpirl/algos/<name>/``."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return cast(Algorithm, importlib.import_module(f"mpirl.algos.{name}.algorithm"))


def info(name: str) -> Info:
    """The ``info`` module (run summaries) of ``mpirl/algos/<name>/``."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return cast(Info, importlib.import_module(f"mpirl.algos.{name}.info"))


if TYPE_CHECKING:  # the contract, held by mypy (tests/test_types.py): each folder's modules are what base.py says
    from mpirl.algos.a3c import algorithm as a3c, info as a3c_info, settings as a3c_settings
    from mpirl.algos.apex import algorithm as apex, info as apex_info, settings as apex_settings
    from mpirl.algos.distql import algorithm as distql, info as distql_info, settings as distql_settings
    from mpirl.algos.impala import algorithm as impala, info as impala_info, settings as impala_settings
    from mpirl.algos.qmix import algorithm as qmix, info as qmix_info, settings as qmix_settings
    from mpirl.job.contract import Settings

    # A module that lacks a member of the contract, or has one with another type, fails here.
    class _Folder:
        def __init__(self, algorithm: Algorithm, info: Info, settings: Settings) -> None: ...

    REGISTRY = {  # one line per algorithm
        "a3c": _Folder(a3c, a3c_info, a3c_settings),
        "apex": _Folder(apex, apex_info, apex_settings),
        "distql": _Folder(distql, distql_info, distql_settings),
        "impala": _Folder(impala, impala_info, impala_settings),
        "qmix": _Folder(qmix, qmix_info, qmix_settings),
    }
