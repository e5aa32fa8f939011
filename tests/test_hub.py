"""The hub on its own: a sum-server (``tests/hub_job.py``) under mpiexec, 1 server and 3 peers, in both modes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mpi4py import MPI

from conftest import ROOT, run_mpi_script
from hub_job import ROUNDS, value
from mpirl.comm.hub import Hub
from mpirl.comm.layout import Layout

PEERS = 3


def run_hub_job(mode: str, tmp_path) -> dict:
    out = tmp_path / f"{mode}.json"
    code, output = run_mpi_script(PEERS + 1, ROOT / "tests" / "hub_job.py", mode, str(out))
    assert code == 0, output
    return json.loads(out.read_text())


def sent(peer: int) -> list[float]:
    """The sums of peer ``peer``'s messages, in order."""
    return [(k + 1) * value(peer, k) for k in range(ROUNDS + peer - 1)]


def test_hub_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        Hub(MPI.COMM_SELF, [], 1, 8, 2, 8, mode="lockstep")


@pytest.mark.mpi
def test_in_rounds_each_round_has_every_live_peer_and_all_get_its_sum(tmp_path):
    result = run_hub_job("rounds", tmp_path)
    server, replies = result["server"], result["replies"]
    most = ROUNDS + PEERS - 1
    # round k: the peers that still had a message k (peer p sends ROUNDS + p - 1), the slow peer 1 included
    assert server["rounds"] == [[k, [p for p in range(1, PEERS + 1) if k < ROUNDS + p - 1]] for k in range(most)]
    total = 0.0
    for k in range(most):
        in_round = [p for p in range(1, PEERS + 1) if k < ROUNDS + p - 1]
        round_sum = sum(sent(p)[k] for p in in_round)
        total += round_sum
        for p in in_round:
            assert replies[str(p)][k] == pytest.approx([k, round_sum, total])
    assert server["total"] == pytest.approx(sum(sum(sent(p)) for p in range(1, PEERS + 1)))
    # handled round by round: no message of round k + 1 before every one of round k
    ks = [k for _, k in server["handled"]]
    assert ks == sorted(ks)


@pytest.mark.mpi
def test_on_arrival_each_message_is_answered_alone_and_a_held_one_after_its_release(tmp_path):
    result = run_hub_job("arrival", tmp_path)
    server, replies = result["server"], result["replies"]
    assert server["total"] == pytest.approx(sum(sum(sent(p)) for p in range(1, PEERS + 1)))
    for p in range(1, PEERS + 1):
        got = replies[str(p)]
        assert [k for k, _, _ in got] == list(range(ROUNDS + p - 1))
        assert [c for _, c, _ in got] == pytest.approx(sent(p))  # each reply credits the peer's own message
    # the running totals in handling order: each reply carries the total just after its message
    running, order = 0.0, server["handled"]
    for p, k in order:
        running += sent(p)[k]
        assert replies[str(p)][k][2] == pytest.approx(running)
    # peer 1's first message was held until every other peer's first had been answered
    first_of_1 = order.index([1, 0])
    assert all(order.index([p, 0]) < first_of_1 for p in range(2, PEERS + 1))


def test_a_hub_sizes_its_inboxes_by_a_layout_answers_and_cancels_the_open_receive_on_close():
    """In one process (the peer is the hub's own rank on COMM_SELF): a gradient in, parameters and version out."""
    grads = Layout({"version": 1}, {"g": ((6,), np.float32)}, max_rows=1)
    hub: Hub[None] = Hub(MPI.COMM_SELF, [0], 1, grads, 2, 8 + 4 * 6)
    assert hub.inbox(0).nbytes == grads.max_nbytes and hub.live == [0]
    out = grads.buffer()
    n = grads.pack(out, {"g": np.arange(6, dtype=np.float32)[None]}, version=3)
    back = np.zeros(8 + 4 * 6, np.uint8)
    send = MPI.COMM_SELF.Isend([out[:n], MPI.BYTE], 0, 1)
    arrived: list[int] = []
    while not arrived:
        arrived = hub.poll()
    send.Wait()
    assert arrived == [0] and hub.nbytes_in(0) == n
    views = grads.views(hub.inbox(0))
    params = hub.outbox(0)
    params[:8].view(np.int64)[0] = int(grads.header(hub.inbox(0))[grads.header_slots["version"]][0]) + 1
    params[8:].view(np.float32)[:] = -views["g"][0]
    hub.reply(0, params.nbytes)
    MPI.COMM_SELF.Recv([back, MPI.BYTE], 0, 2)
    assert back[:8].view(np.int64)[0] == 4 and back[8:].view(np.float32).tolist() == [-x for x in range(6)]
    hub.finish(0)
    assert hub.finished and hub.live == []
    hub.close()  # the receive posted with the reply, never matched: cancelled
    assert all(r == MPI.REQUEST_NULL for r in hub.recvs)
