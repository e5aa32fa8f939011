"""The MPI halves of ``mpirl bench transport`` and ``mpirl bench actor``: two ranks, rank 1 sends to rank 0.

Run by the benchmarks as ``mpiexec -n 2 python -m mpirl.bench.ranks WHAT OUT.json``;
rank 0 writes the measurements to OUT.json.

* transport: experience messages of an actor (rank 1) to its buffer (rank 0) through
  the project's send ring and receive pool (Test polling with back-off, as the roles
  run them), against raw mpi4py ``Isend``/``Irecv`` of the same bytes with the same
  number of messages in flight, completed with blocking waits (the physical limit).
* actor: rank 1 runs the actor's acting loop and sends every batch to rank 0, which
  receives like a buffer; the bare loop without MPI is measured by the caller.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from mpirl.agents.dqn import transition_spec
from mpirl.comm.backoff import Backoff
from mpirl.comm.messages import TAG_EXPERIENCE, experience_layout
from mpirl.comm.pools import RecvPool, SendRing
from mpirl.replay.frames import framed_fields

RING, DEPTH = 4, 2  # the roles' defaults: comm.send_ring, comm.recv_depth

# (label, observation shape, dtype, records per message): CartPole's and Breakout's actor messages
SHAPES = [("cartpole", (4,), np.float32, 50), ("atari", (4, 84, 84), np.uint8, 64)]


def _records(fields: dict, rows: int, rng) -> dict:
    out = {}
    for name, (shape, dtype) in fields.items():
        a = rng.integers(0, 255, size=(rows, *shape)) if np.dtype(dtype).kind in "iub" else rng.random((rows, *shape))
        out[name] = a.astype(dtype)
    return out


def pools(comm, layout, msgs: int, records: dict, counts: dict) -> float:
    """Seconds for ``msgs`` messages through SendRing -> RecvPool (rank 1 -> rank 0)."""
    if comm.rank == 1:
        ring = SendRing(comm, 0, TAG_EXPERIENCE, layout.max_nbytes, RING)
        slot, buf = ring.acquire()
        nbytes = layout.pack(buf, records, actor=1, **{f"{c}_rows": n for c, n in counts.items()})
        for b in ring.buffers:  # every ring buffer holds the packed message: sends need not re-pack
            b[:nbytes] = buf[:nbytes]
        comm.Barrier()
        for _ in range(msgs):
            slot, _buf = ring.acquire()
            ring.send(slot, nbytes)
        ring.close()
        return 0.0
    pool = RecvPool(comm, [1], TAG_EXPERIENCE, layout.max_nbytes, DEPTH)
    backoff, got = Backoff(), 0
    comm.Barrier()
    start = None
    while got < msgs:
        done = pool.poll()
        if not done:
            backoff.sleep()
            continue
        backoff.reset()
        for slot, _src, buf, _n in done:
            if start is None:
                start = time.perf_counter()
            got += 1
            pool.post(slot)
    elapsed = time.perf_counter() - start
    pool.close()
    return elapsed


def raw(comm, nbytes: int, msgs: int) -> float:
    """Seconds for ``msgs`` raw Isend/Irecv messages of ``nbytes``, same depths, blocking waits."""
    bufs = [np.ones(nbytes, np.uint8) for _ in range(RING if comm.rank == 1 else DEPTH)]
    comm.Barrier()
    if comm.rank == 1:
        reqs = [MPI.REQUEST_NULL] * RING
        for i in range(msgs):
            k = i % RING
            reqs[k].Wait()
            reqs[k] = comm.Isend([bufs[k], MPI.BYTE], 0, TAG_EXPERIENCE)
        MPI.Request.Waitall(reqs)
        return 0.0
    reqs = [comm.Irecv([b, MPI.BYTE], 1, TAG_EXPERIENCE) for b in bufs]
    start = None
    for i in range(msgs):
        k = i % DEPTH
        reqs[k].Wait()
        if start is None:
            start = time.perf_counter()
        if i + DEPTH < msgs:
            reqs[k] = comm.Irecv([bufs[k], MPI.BYTE], 1, TAG_EXPERIENCE)
    return time.perf_counter() - start


def transport(comm, reps: int, seconds: float) -> dict:
    rng = np.random.default_rng(0)
    results = {}
    for label, shape, dtype, rows in SHAPES:
        spec = transition_spec(shape, dtype)
        framed = framed_fields(spec)  # Atari: frames once, one new frame a transition (as actors send them)
        layout = experience_layout(spec, rows, framed, games=4)
        records = _records(layout.fields, rows, rng)
        counts = {c: rows for c in layout.counted}
        nbytes = layout.nbytes(rows, **counts)
        # Messages per repetition: about ``seconds`` at 2 GB/s, at least 200.
        msgs = max(200, int(seconds * 2e9 / nbytes))
        res = {"nbytes": nbytes, "records": rows, "msgs": msgs, "pools": [], "raw": []}
        for _ in range(reps + 1):  # the first of each is a warm-up
            res["pools"].append(pools(comm, layout, msgs, records, counts))
            res["raw"].append(raw(comm, nbytes, msgs))
        res["pools"], res["raw"] = res["pools"][1:], res["raw"][1:]
        results[label] = res
    return results


def actor(comm, env_id: str, envs: int, seconds: float, reps: int) -> dict:
    """Env steps/s of the acting loop on rank 1, alternately without and with sending every batch to rank 0.

    Both halves of a repetition run in the same process on the same games, one after
    the other, so drifts of the machine (clock, memory, other load) hit both alike.
    The half without sending makes no MPI call at all: batches are dropped once their
    priorities are computed.
    """
    from mpirl.bench.actor import acting_for, receive_until_final
    from mpirl.actor_learner.experience import ExperienceSender
    if comm.rank == 0:
        return {"received": receive_until_final(comm, env_id, envs)}
    acting, cfg, spec = acting_for(env_id, envs)
    batch = cfg.comm.send_batch
    sender = ExperienceSender(comm, spec, batch, cfg.comm.send_ring, 1, acting.frames, acting.framed)
    rates = {"send": [], "bare": []}
    acting.start()
    for rep in range(reps + 1):  # the first is a warm-up
        for mode in ("bare", "send"):
            steps0, t0 = acting.env_steps, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                acting.step()
                while acting.staged >= batch or sender.frames_due:  # frames once (Atari): as the actor rank sends
                    rows = min(batch, acting.staged)
                    records, prio = acting.take(rows)
                    oldest = acting.oldest_frame(rows)
                    if mode == "send":
                        sender.send(records, prio, acting.episodes, oldest=oldest, env_steps=acting.env_steps)
                    else:
                        acting.episodes.clear()
                        if acting.frames is not None:
                            acting.frames.sent_upto(oldest)
                    acting.drop(rows)
            if rep:
                rates[mode].append((acting.env_steps - steps0) / (time.perf_counter() - t0))
    rec, prio = acting.take(0)
    sender.send(rec, prio, acting.episodes, final=True, oldest=acting.oldest_frame(0))
    sender.close()
    acting.close()
    comm.send(rates, dest=0, tag=99)
    return {}


def main(argv: list[str]) -> int:
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        print(f"mpirl.bench.ranks needs 2 ranks, got {comm.size}", file=sys.stderr)
        return 2
    what, out = argv[0], argv[1]
    opts = json.loads(argv[2]) if len(argv) > 2 else {}
    if what == "transport":
        result = transport(comm, opts.get("reps", 5), opts.get("seconds", 0.3))
    else:
        result = actor(comm, opts["env"], opts.get("envs", 1), opts.get("seconds", 1.0), opts.get("reps", 5))
        if comm.rank == 0:
            result["rates"] = comm.recv(source=1, tag=99)
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
