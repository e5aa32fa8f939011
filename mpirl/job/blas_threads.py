"""numpy's matrix products on a rank: one thread (OpenBLAS's own pool), unless the user chose.

An Ape-X actor on vector observations computes its network in numpy (:mod:`mpirl.agents.acting`), and numpy's
OpenBLAS starts a thread per core when it loads, each product over a few hundred thousand multiply-adds then split
across them: on a node whose ranks fill its cores that only makes them wait for each other, as torch's threads would
(``agent.torch_threads`` sets those; an actor's are one). The pool's size is read once, when numpy is first imported,
so :func:`one_blas_thread` runs on every rank before anything imports numpy. ``OPENBLAS_NUM_THREADS`` the user set
stands; ``mpirl launch`` sets ``OMP_NUM_THREADS=1``, which OpenBLAS also reads, and this makes a plain ``mpiexec`` or
``srun`` the same.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "OPENBLAS_NUM_THREADS"


def one_blas_thread() -> bool:
    """Before numpy is imported: True when ``OPENBLAS_NUM_THREADS`` was unset and is now 1."""
    if VARIABLE in os.environ or "numpy" in sys.modules:
        return False
    os.environ[VARIABLE] = "1"
    return True
