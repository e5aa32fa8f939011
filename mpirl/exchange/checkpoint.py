"""The exchange family's checkpoints (DistQL's): a consistent cut of the server and every worker, in one HDF5 file.

A cut (:class:`Cut`) starts when a checkpoint is due (``checkpoint.every_seconds``) or the run stops (a signal,
a stop condition). From then on the server's reply to each worker's next exchange carries the checkpoint flag;
the worker applies it and sends its state (:class:`~mpirl.exchange.messages.State`), which the server
writes into the file at once. An exchange from a worker already in the cut is held, neither recorded nor merged,
until the cut is committed: so the server's table holds exactly the exchanges each worker had made when its state
was taken, and a resumed run counts no episode twice and loses none. The cut is committed (the table, the merge
counts, the counters and the generators' states written, the file synced and renamed to
``checkpoints/ckpt-<merges>.h5``) once every worker has sent its state or has finished. In ``sync`` mode the cut
is one round; in ``async`` mode the fast workers wait, at most, for the slowest to reach its next exchange.

Layout: root attributes ``identity``, ``job_time``, ``train_steps`` (the merges), ``step_name`` (the header every
checkpoint has, :func:`mpirl.job.checkpoint.header`) and the server's counters; ``server/`` the table (``q``,
``eta``, ``seen``, ``merges``) and the returns of the stop condition's window; ``workers/<rank>/`` each worker's
seen pairs (``idx``, ``q``, ``eta``), its generator (``rng``) and counters in attributes.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from mpirl.exchange.builder import ServerTable
from mpirl.exchange.messages import State
from mpirl.atomic import commit
from mpirl.metrics.run_file import plain
from mpirl.job import checkpoint

PENDING = "ckpt-cut.h5.tmp"  # the cut being taken; a killed job leaves it, and nothing reads it


class Cut:
    """One checkpoint being taken on the server (see the module docstring)."""

    def __init__(self, run_dir: Path, expected: set[int], stop: bool):
        self.run_dir, self.stop = Path(run_dir), stop
        self.expected = set(expected)  # workers still playing when the cut started: each sends its state
        self.members: set[int] = set()  # workers whose reply carried the flag
        self.states: dict[int, bool] = {}  # worker -> whether its state was its last (it then says goodbye)
        self.tmp = checkpoint.path_for(run_dir, 0).with_name(PENDING)
        self.file = h5py.File(self.tmp, "w", locking=False)

    def join(self, worker: int) -> bool:
        """True the first time: the reply about to go to ``worker`` takes it into the cut (carries the flag)."""
        if worker in self.members:
            return False
        self.members.add(worker)
        return True

    def add_state(self, worker: int, state: State) -> None:
        g = self.file.create_group(f"workers/{worker}")
        for name in ("idx", "q", "eta"):
            g.create_dataset(name, data=getattr(state, name))
        g.create_dataset("rng", data=np.asarray(state.rng[1], np.int64))
        g.attrs.update(played=state.played, rounds=state.rounds, env_steps=state.env_steps, last=state.last,
                       compute_s=state.compute_s, wait_s=state.wait_s, env_rng=state.env_rng)
        self.states[worker] = state.last

    def complete(self, done: set[int]) -> bool:
        """Every worker that was playing has sent its state (and said goodbye, if that was its last), or finished
        before its turn came (it said goodbye after its last reply, which came before the cut)."""
        for w in self.expected:
            if w in self.members:
                if w not in self.states or (self.states[w] and w not in done):
                    return False
            elif w not in done:
                return False
        return True

    def commit(self, table: ServerTable, merged: int, finished: set[int], job_time: float, identity: dict, server: dict,
               returns, keep: int) -> Path:
        """Write the server's part (``finished``: the workers that have played all their episodes), sync, rename
        to ``ckpt-<merges>.h5``; keep the newest ``keep``."""
        f = self.file
        g = f.create_group("server")
        for name in ("q", "eta", "seen", "merges"):
            g.create_dataset(name, data=getattr(table, name))
        g.create_dataset("returns", data=np.asarray(returns, np.float64))
        f.attrs.update(format=checkpoint.FORMAT, identity=json.dumps(identity), job_time=job_time,
                       train_steps=merged, step_name="merges", finished=np.asarray(sorted(finished), np.int64),
                       server=json.dumps(server))
        f.close()
        path = checkpoint.path_for(self.run_dir, merged, ".h5")
        commit(self.tmp, path)
        checkpoint.prune(self.run_dir, keep)
        return path

    def abandon(self) -> None:
        if self.file.id.valid:
            self.file.close()
        self.tmp.unlink(missing_ok=True)


def read_server(path: Path) -> dict:
    """The server's part: ``q``, ``eta``, ``seen``, ``merges`` arrays, ``returns``, ``merged``, ``finished`` (the
    workers that had played all their episodes) and the counters it saved (``server``)."""
    with h5py.File(path, "r", locking=False) as f:
        g = f["server"]
        out = {name: g[name][()] for name in ("q", "eta", "seen", "merges", "returns")}
        out.update(merged=int(f.attrs["train_steps"]), finished={int(w) for w in f.attrs["finished"]},
                   server=json.loads(plain(f.attrs["server"])))
    return out


def read_worker(path: Path, worker: int) -> State | None:
    """Worker ``worker``'s state at the cut; None when it had finished before it."""
    with h5py.File(path, "r", locking=False) as f:
        if worker in {int(w) for w in f.attrs["finished"]}:
            return None
        g = f[f"workers/{worker}"]
        a = g.attrs
        return State(int(a["played"]), int(a["rounds"]), int(a["env_steps"]), bool(a["last"]),
                     float(a["compute_s"]), float(a["wait_s"]), (3, tuple(g["rng"][()].tolist()), None),
                     plain(a["env_rng"]), g["idx"][()], g["q"][()], g["eta"][()])
