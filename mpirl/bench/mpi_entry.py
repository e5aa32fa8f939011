"""The ``__main__`` of a measurement module run under ``mpiexec`` by :func:`mpirl.bench.run_mpi.mpiexec_json`:
``python -m MODULE WHAT OUT.json OPTS`` — rank 0 writes the measurement's result as JSON; one rank's failure ends
every rank (the others may wait in a collective)."""

from __future__ import annotations

import json
import sys
import traceback
from typing import Callable

from mpi4py import MPI


def main(module: str, what: str, measure: Callable[[MPI.Comm, dict], dict]) -> None:
    """Run ``measure(COMM_WORLD, opts)`` for the measurement named ``what`` and exit: 0, 2 for another name, or
    ``Abort`` on an exception."""
    comm = MPI.COMM_WORLD
    try:
        asked, out = sys.argv[1], sys.argv[2]
        opts = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
        if asked != what:
            print(f"{module}: unknown measurement {asked!r}", file=sys.stderr)
            sys.exit(2)
        result = measure(comm, opts)
        if comm.rank == 0:
            with open(out, "w") as f:
                json.dump({"ranks": comm.size, **result}, f)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
    sys.exit(0)
