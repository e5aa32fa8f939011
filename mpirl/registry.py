"""The algorithms by name: each folder of :mod:`mpirl.algos` imported when a job needs it, and ``REGISTRY``, one line
per algorithm, through which mypy holds every folder to the contract (:mod:`mpirl.job.contract`).

It sits above the algorithms (the command line and the benchmarks use it); the layers below get the algorithm
they run handed to them."""


from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from mpirl.job.contract import Algorithm, Info, Trained
from mpirl.sections import ALGORITHMS


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


def trained(name: str) -> Trained:
    """The ``trained`` module (a checkpoint's policy, for play and export) of ``mpirl/algos/<name>/``."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return cast(Trained, importlib.import_module(f"mpirl.algos.{name}.trained"))


if TYPE_CHECKING:  # the contract, held by mypy (tests/test_types.py): each folder's modules are what the contract says
    from mpirl.algos.a3c import (algorithm as a3c, info as a3c_info, settings as a3c_settings,
                                 trained as a3c_trained)
    from mpirl.algos.apex import (algorithm as apex, info as apex_info, settings as apex_settings,
                                  trained as apex_trained)
    from mpirl.algos.distql import (algorithm as distql, info as distql_info, settings as distql_settings,
                                    trained as distql_trained)
    from mpirl.algos.impala import (algorithm as impala, info as impala_info, settings as impala_settings,
                                    trained as impala_trained)
    from mpirl.algos.qmix import (algorithm as qmix, info as qmix_info, settings as qmix_settings,
                                  trained as qmix_trained)
    from mpirl.job.contract import Settings

    # A module that lacks a member of the contract, or has one with another type, fails here.
    class _Folder:
        def __init__(self, algorithm: Algorithm, info: Info, settings: Settings, trained: Trained) -> None: ...

    REGISTRY = {  # one line per algorithm
        "a3c": _Folder(a3c, a3c_info, a3c_settings, a3c_trained),
        "apex": _Folder(apex, apex_info, apex_settings, apex_trained),
        "distql": _Folder(distql, distql_info, distql_settings, distql_trained),
        "impala": _Folder(impala, impala_info, impala_settings, impala_trained),
        "qmix": _Folder(qmix, qmix_info, qmix_settings, qmix_trained),
    }
