"""A sum-server on a :class:`mpirl.comm.hub.Hub`, run by ``tests/test_hub.py`` under mpiexec.

    mpiexec -n N python tests/hub_job.py MODE OUT.json

Rank 0 serves ranks 1..N-1. Peer p sends ``ROUNDS + p - 1`` messages (so the peers finish at different rounds);
its message k holds ``k + 1`` float64 values, each ``p + k / 10`` (so the size varies), after an int64 header
(k, last). After its last reply it sends a header-only goodbye (last = 1). The hub replies with (k, the sum
credited to this reply, the running total):

* ``arrival``: each message is added to the total as it comes and answered at once; peer 1's first message is
  held until every other peer's first message has been answered (what a consistent cut does), then released.
* ``rounds``: a round closes once every live peer has sent its message k; its sum is answered to each.

Peer 1 sleeps before each send, so without rounds the others would run ahead. Rank 0 writes every peer's replies,
the order the server handled messages in and the rounds it closed to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

from mpirl.comm.backoff import Backoff
from mpirl.comm.hub import Hub, ask

ROUNDS, TAG, REPLY = 4, 7, 8
HEAD = 16  # int64 k, int64 last


def value(peer: int, k: int) -> float:
    return peer + k / 10


def peer_main(comm: MPI.Comm, rounds: int) -> list:
    me = comm.rank
    out = np.empty(HEAD + 8 * (rounds + 1), np.uint8)
    back = np.empty(24, np.uint8)
    replies = []
    for k in range(rounds):
        if me == 1:
            time.sleep(0.05)
        out[:HEAD].view(np.int64)[:] = (k, 0)
        out[HEAD:HEAD + 8 * (k + 1)].view(np.float64)[:] = value(me, k)
        ask(comm, 0, out[:HEAD + 8 * (k + 1)], back, TAG, REPLY)
        kk, credited, total = back.view(np.float64)
        replies.append([int(kk), float(credited), float(total)])
    out[:HEAD].view(np.int64)[:] = (rounds, 1)
    comm.Send([out[:HEAD], MPI.BYTE], dest=0, tag=TAG)
    return replies


def server_main(comm: MPI.Comm, mode: str) -> dict:
    peers = list(range(1, comm.size))
    most = ROUNDS + len(peers) - 1
    hub: Hub[tuple[int, float]] = Hub(comm, peers, TAG, HEAD + 8 * (most + 1), REPLY, 24, mode=mode)
    total, handled, rounds = 0.0, [], []
    first_seen: set[int] = set()
    releasing = [False]

    def answer(peer: int, k: int, credited: float) -> None:
        hub.outbox(peer)[:24].view(np.float64)[:] = (k, credited, total)
        hub.reply(peer, 24)

    def handle(peer: int) -> None:
        nonlocal total
        buf = hub.inbox(peer)
        k, last = (int(x) for x in buf[:HEAD].view(np.int64))
        if last:
            assert hub.nbytes_in(peer) == HEAD
            hub.finish(peer)
            return
        assert hub.nbytes_in(peer) == HEAD + 8 * (k + 1), (peer, k, hub.nbytes_in(peer))
        values = buf[HEAD:HEAD + 8 * (k + 1)].view(np.float64)
        if mode == "rounds":
            hub.join(peer, (k, float(values.sum())))
            return
        if peer == 1 and k == 0 and not releasing[0]:
            hub.hold(peer)
            return
        total += float(values.sum())
        handled.append([peer, k])
        answer(peer, k, float(values.sum()))
        if k == 0:
            first_seen.add(peer)

    backoff = Backoff()
    while not hub.finished:
        arrived = hub.poll()
        for peer in arrived:
            handle(peer)
        if mode == "arrival" and first_seen >= set(peers[1:]) and hub.held:
            releasing[0] = True
            for peer in hub.release():
                handle(peer)
        batch = hub.round()
        if batch is not None:
            ks = {k for k, _ in batch.values()}
            assert len(ks) == 1, f"a round of mixed messages {batch}"
            k = ks.pop()
            credited = sum(s for _, s in batch.values())
            total += credited
            rounds.append([k, sorted(batch)])
            for peer in batch:
                handled.append([peer, k])
                answer(peer, k, credited)
        if arrived or batch is not None:
            backoff.reset()
        else:
            backoff.sleep()
    hub.close()
    return {"total": total, "handled": handled, "rounds": rounds}


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    try:
        mine = server_main(comm, mode) if comm.rank == 0 else peer_main(comm, ROUNDS + comm.rank - 1)
    except BaseException:  # the others would wait for this rank forever
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
    everything = comm.gather(mine, root=0)
    if everything is not None:  # rank 0
        server, *replies = everything
        with open(out, "w") as f:
            json.dump({"server": server, "replies": {str(p): r for p, r in enumerate(replies, 1)}}, f)


if __name__ == "__main__":
    main()
