"""SIGTERM or SIGUSR1 on any rank: the learner checkpoints and every rank exits cleanly.

The handlers only note the signal. The learner looks at its own note and at the
notices other ranks send it (one small message each, on a communicator of their
own) every turn of its loop, and stops the job the usual way: the stop flag in
the last parameter broadcast, after a checkpoint.

How the signal gets there: Open MPI's ``mpiexec`` forwards SIGUSR1 to every
rank, but follows a SIGTERM with SIGKILL within a fraction of a second, so
``mpirl launch`` turns Ctrl-C, SIGTERM and SIGHUP into SIGUSR1 to its ``mpiexec``
(``mpirl/launcher.py``), and a plain ``mpiexec`` is preempted with
``kill -USR1 <mpiexec pid>``. Under Slurm, ``srun``
steps get SIGTERM and ``KillWait`` seconds (30 by default) before SIGKILL;
batch templates ask for ``--signal=B:USR1@120`` and forward it.
"""

from __future__ import annotations

import signal
import time

import numpy as np
from mpi4py import MPI

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
TAG = 77
POLL_SECONDS = 0.05  # how often the learner tests for other ranks' notices: an MPI_Test can yield the core


PREEMPTED = "preempted"  # how a stop reason starts when a signal stopped the job


class Preemption:
    """One per rank; construct on every rank in the same order (it duplicates ``world``)."""

    def __init__(self, world: MPI.Comm):
        self.comm = world.Dup()
        self.rank = world.rank
        self.signum = 0
        self.notice: tuple[int, int] | None = None  # learner: (rank, signal) of the first preemption seen
        self._out = np.zeros(2, np.int64)
        self._send: MPI.Request | None = None
        self._in = np.zeros(2, np.int64)
        self._recv: MPI.Request = self._post() if self.rank == 0 else MPI.REQUEST_NULL  # rank 0 takes notices
        self._received = 0
        self._polled = 0.0
        self._previous = {s: signal.signal(s, self._note) for s in SIGNALS}

    def _note(self, signum, frame) -> None:
        if not self.signum:
            self.signum = signum

    def _post(self) -> MPI.Request:
        return self.comm.Irecv(self._in, source=MPI.ANY_SOURCE, tag=TAG)

    def requested(self) -> tuple[int, int] | None:
        """On the learner: ``(rank, signal number)`` once any rank was signalled, else None.

        On other ranks: tell the learner about this rank's signal (once); always None.
        """
        if self.rank != 0:
            if self.signum and self._send is None:
                self._out[:] = (self.rank, self.signum)
                self._send = self.comm.Isend(self._out, dest=0, tag=TAG)
            return None
        if self.notice is None:
            if self.signum:
                self.notice = (0, self.signum)
            elif time.perf_counter() - self._polled >= POLL_SECONDS and self._poll():
                self.notice = (int(self._in[0]), int(self._in[1]))
                self._received += 1
                self._recv = self._post()
        return self.notice

    def _poll(self) -> bool:
        # With --oversubscribe Open MPI yields the core inside MPI_Test: at most every POLL_SECONDS,
        # so the learner's loop does not hand its time slices to other ranks on every turn.
        self._polled = time.perf_counter()
        return self._recv.Test()

    def close(self) -> None:
        """Collective: match every notice sent, restore the signal handlers, free the communicator."""
        sent = self.comm.allreduce(0 if self._send is None else 1)
        if self.rank == 0:
            while self._received < sent:
                self._recv.Wait()
                self._received += 1
                self._recv = self._post()
            self._recv.Cancel()
            self._recv.Wait()
        elif self._send is not None:
            self._send.Wait()
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self.comm.Free()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
