"""Transport: actor -> buffer experience messages through the project's pools vs raw mpi4py.

    mpirl bench transport [--reps 5]

Two ranks on this machine (``mpiexec -n 2``). Ours: the actor's send ring
(``Isend`` from recycled buffers, ``Test`` to recycle) into the buffer's receive
pool (pre-posted ``Irecv``, ``Testsome`` polling with a sleeping back-off, a
zero-copy view of each message). Reference: raw ``Isend``/``Irecv`` of the same
bytes with the same number of messages in flight (4 sends, 2 receives), each
completed by a blocking ``Wait``: what MPI itself can do here. Message sizes are
the real ones: 50 CartPole transitions (about 4 KB) and 64 Breakout transitions
with frames once (about 0.45 MB: 64 new uint8 frames and frame ids, as an actor
sends them; 3.6 MB as frame stacks).
"""

from __future__ import annotations

from mpirl.bench.report import MIN_REPS, Row
from mpirl.bench.run_mpi import mpiexec_json


def run(reps: int = MIN_REPS, seconds: float = 0.3) -> list[Row]:
    # The timeout is a hang's: two ranks starting on a loaded machine can take minutes.
    out = mpiexec_json("transport", {"reps": reps, "seconds": seconds}, timeout=300 + 6 * reps * seconds * 4)
    rows = []
    for label, res in out.items():
        n, msgs, recs = res["nbytes"], res["msgs"], res["records"]
        gbs = Row(f"transport {label} ({recs} transitions, {n:,} B a message)", "GB/s", "mpirl pools",
                  "raw mpi4py Isend/Irecv", target=0.8)
        exps = Row(f"transport {label} experiences", "experiences/s", "mpirl pools", "raw mpi4py Isend/Irecv")
        for impl, key in (("mpirl pools", "pools"), ("raw mpi4py Isend/Irecv", "raw")):
            gbs.values[impl] = [msgs * n / s / 1e9 for s in res[key]]
            exps.values[impl] = [msgs * recs / s for s in res[key]]
        rows += [gbs, exps]
    return rows
