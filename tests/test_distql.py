"""DistQL: the table logic against hand-computed values, the messages, and real MPI jobs (exit codes and what
they wrote to qserver.h5): learning, determinism in sync mode, replies, bad input, a failing worker."""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import h5py
import numpy as np
import pytest

from mpirl.agents.tabular import ServerTable, WorkerTable, end_penalty, epsilon_at
from mpirl.envs.discrete import CARTPOLE_BOUNDS, Discretizer
from mpirl.exchange import messages as msg

from conftest import JOBS, run_cli

TAXI = str(JOBS / "taxi_distql.toml")


# ---- the server's merge (DistQL Eq. 1) ----

def test_merge_matches_hand_computed_values():
    t = ServerTable(1, 2, server_eta=0.99, eta_decay=0.999)
    assert t.merge(np.array([1], np.int32), np.array([10.0]), np.array([0.5])) == 1
    # a new pair starts at (0, 0.99): eta_c = min(0.99, 0.5) = 0.5, weight 0.5^2 / 0.5 = 0.5, Q_c = 0.5 * 10
    assert t.q[0, 1] == pytest.approx(5.0) and t.eta[0, 1] == pytest.approx(0.4995)
    assert t.merge(np.array([1], np.int32), np.array([2.0]), np.array([0.3])) == 0
    # eta_c = min(0.4995, 0.3) = 0.3, weight 0.09 / 0.3 = 0.3: 0.7 * 5 + 0.3 * 2 = 4.1
    assert t.q[0, 1] == pytest.approx(4.1) and t.eta[0, 1] == pytest.approx(0.2997)
    t.merge(np.array([1], np.int32), np.array([8.0]), np.array([0.4]))
    w = 0.2997 ** 2 / 0.4  # eta_c stays 0.2997 (below 0.4)
    assert t.q[0, 1] == pytest.approx((1 - w) * 4.1 + w * 8.0) and t.eta[0, 1] == pytest.approx(0.999 * 0.2997)
    assert t.q[0, 0] == 0 and not t.seen[0, 0] and t.merges[0, 1] == 3 and t.merges[0, 0] == 0


def test_after_every_merge_the_server_eta_is_at_most_the_worker_eta():
    rng = np.random.default_rng(0)
    t = ServerTable(50, 4)
    for _ in range(300):
        idx = rng.choice(200, size=rng.integers(1, 60), replace=False).astype(np.int32)
        eta_i = rng.uniform(1e-4, 1.0, len(idx))
        t.merge(idx, rng.normal(size=len(idx)), eta_i)
        assert np.all(t.eta.ravel()[idx] <= eta_i)


def test_all_and_partial_replies_and_how_a_worker_applies_them():
    server = ServerTable(3, 2)
    server.merge(np.array([0, 3], np.int32), np.array([4.0, -2.0]), np.array([0.5, 0.5]))
    server.merge(np.array([5], np.int32), np.array([1.0]), np.array([0.25]))
    idx, q, eta = server.reply_all()  # every pair the server holds, nothing else
    assert idx.tolist() == [0, 3, 5] and q.tolist() == pytest.approx([2.0, -1.0, 0.25])
    idx_p, q_p, _ = server.reply_partial(np.array([3], np.int32))
    assert idx_p.tolist() == [3] and q_p.tolist() == pytest.approx([-1.0])

    w = WorkerTable(3, 2)
    w.update(0, 0, 1.0, 1, False)  # the worker has seen (0, 0) only
    eta_before = w.eta[0, 0]
    w.apply_all(idx, q, eta)
    assert w.q[0, 0] == pytest.approx(2.0) and w.eta[0, 0] == eta_before  # seen: the value, not eta
    assert w.seen[1, 1] and w.q[1, 1] == pytest.approx(-1.0) and w.eta[1, 1] == pytest.approx(server.eta[1, 1])
    assert w.seen[2, 1] and not w.seen[1, 0]

    p = WorkerTable(3, 2)
    p.update(1, 1, 3.0, 2, False)
    p.update(0, 1, 3.0, 2, False)
    p.apply_partial(idx_p, q_p)  # only the sent pair changes
    assert p.q[1, 1] == pytest.approx(-1.0) and p.q[0, 1] == pytest.approx(3.0) and not p.seen[2, 1]


# ---- the worker's Q-learning ----

def test_worker_update_follows_the_source_code():
    w = WorkerTable(2, 2, gamma=0.9, eta0=0.5, eta_decay=0.999)
    w.update(0, 1, 5.0, 1, False)  # first update starts from Q = r; s' unseen: its max is 0
    assert w.q[0, 1] == pytest.approx(5.0 + 0.5 * (5.0 + 0.0 - 5.0)) and w.eta[0, 1] == pytest.approx(0.4995)
    w.update(1, 0, 2.0, 1, True)  # the source bootstraps through a termination
    q10 = 2.0 + 0.5 * (2.0 + 0.9 * 2.0 - 2.0)
    assert w.q[1, 0] == pytest.approx(q10)
    w.update(0, 1, 1.0, 1, False)  # the k-th update uses 0.5 * 0.999^k
    assert w.q[0, 1] == pytest.approx(5.0 + 0.4995 * (1.0 + 0.9 * q10 - 5.0))
    assert w.eta[0, 1] == pytest.approx(0.5 * 0.999 ** 2)  # two updates of (0, 1)
    idx, q, eta = w.changed_pairs()
    assert idx.tolist() == [1, 2] and q.tolist() == pytest.approx([w.q[0, 1], w.q[1, 0]])
    assert w.changed_pairs()[0].size == 0  # a send forgets them


def test_textbook_variant_starts_from_zero_and_stops_at_terminations():
    w = WorkerTable(2, 2, textbook=True)
    w.update(1, 0, 4.0, 1, False)
    assert w.q[1, 0] == pytest.approx(2.0)  # 0 + 0.5 * (4 + 0.9 * max(Q(1, .)) over seen (= 0 before) - 0)
    w.update(0, 0, 1.0, 1, True)
    assert w.q[0, 0] == pytest.approx(0.5)  # no bootstrap past a termination


def test_greedy_and_max_run_over_seen_actions_only():
    w = WorkerTable(3, 3)
    w.update(0, 2, -7.0, 1, False)  # only action 2 seen, and it is negative
    rng = random.Random(0)
    assert w.greedy(0, rng) == 2 and w.value(0) == pytest.approx(w.q[0, 2]) and w.value(2) == 0.0
    assert {w.greedy(2, rng) for _ in range(200)} == {0, 1, 2}  # an unseen state: a random action
    assert epsilon_at(0) == 0.1 and epsilon_at(1000) == pytest.approx(0.1 * 0.999 ** 1000)
    assert end_penalty("CartPole-v1", float("nan")) == -200 and end_penalty("Taxi-v4", float("nan")) == 0


def test_the_cartpole_discretizer_is_np_digitize_on_the_interior_edges():
    d = Discretizer(CARTPOLE_BOUNDS, [8, 8, 8, 12])
    assert d.n_states == 6144 and all(len(e) == n - 1 for e, n in zip(d.edges, [8, 8, 8, 12]))
    rng = np.random.default_rng(1)
    for k in range(3000):
        obs = (rng.normal(size=4) * [2.0, 2.0, 0.8, 3.0]).astype(np.float32)
        if k % 5 == 0:  # exactly on an edge, and beyond the bounds
            obs[k % 4] = d.edges[k % 4][k % len(d.edges[k % 4])]
        if k % 7 == 0:
            obs[k % 4] = 100.0 * (-1) ** k
        want = np.ravel_multi_index([int(np.digitize(x, e)) for x, e in zip(obs, d.edges)], d.shape)
        assert d(obs) == want


def test_messages_round_trip():
    buf = np.empty(msg.exchange_nbytes(5, 3), np.uint8)
    n = msg.pack_exchange(buf, 7, 1234, 21, True, False, 1.5, 0.25, np.arange(5, dtype=np.int32),
                          np.linspace(0, 1, 5), np.full(5, 0.5), np.array([18, 19, 20]), np.array([1.0, 2, 3]),
                          np.array([4.0, 5, 6]), np.array([10, 11, 12]), np.array([0.1, 0.1, 0.1]))
    assert n == msg.exchange_nbytes(5, 3) == 80 + 20 * 5 + 40 * 3
    ex = msg.unpack_exchange(buf)
    assert (ex.round, ex.env_steps, ex.episodes_done, ex.last, ex.torch_imported, ex.bye) == (7, 1234, 21, True,
                                                                                             False, False)
    assert ex.idx.tolist() == list(range(5)) and ex.q.tolist() == pytest.approx(np.linspace(0, 1, 5))
    assert ex.episode.tolist() == [18, 19, 20] and ex.length.tolist() == [10, 11, 12] and ex.compute_s == 1.5
    rb = np.empty(msg.reply_nbytes(2), np.uint8)
    assert msg.pack_reply(rb, 3, True, np.array([4, 9], np.int32), np.array([1.0, 2.0]), np.array([.5, .25])) \
        == 32 + 40
    r = msg.unpack_reply(rb)
    assert (r.round, r.stop, r.idx.tolist(), r.eta.tolist()) == (3, True, [4, 9], [0.5, 0.25])


def test_a_workers_state_round_trips_through_its_message_and_restores_its_table():
    rng = random.Random(4)
    table = WorkerTable(6, 2)
    for s_, a in ((0, 1), (3, 0), (5, 1)):
        table.update(s_, a, 1.0, (s_ + 1) % 6, False)
    table.changed_pairs()  # sent: nothing changed since
    state = msg.State(12, 3, 400, False, 1.25, 0.5, rng.getstate(), '{"x": 1}', *table.seen_pairs())
    buf = np.empty(msg.state_nbytes(12), np.uint8)
    got = msg.unpack_state(buf[:msg.pack_state(buf, state)])
    assert (got.played, got.rounds, got.env_steps, got.last, got.compute_s, got.env_rng) == (12, 3, 400, False,
                                                                                            1.25, '{"x": 1}')
    assert got.rng == rng.getstate() and got.idx.tolist() == [1, 6, 11]
    again = WorkerTable(6, 2)
    again.restore(got.idx, got.q, got.eta)
    assert np.array_equal(again.q, table.q) and np.array_equal(again.eta, table.eta)
    assert np.array_equal(again.seen, table.seen) and again.changed_pairs()[0].size == 0


def test_a_greedy_evaluation_that_loops_is_cut_and_counted():
    """CliffWalking sets no step limit: a table whose best action is always 'up' walks to the top row and stays."""
    from mpirl.exchange.server import evaluate
    from mpirl.config import EnvConfig
    from mpirl.envs.discrete import make_tabular_env
    env = make_tabular_env(EnvConfig(id="CliffWalking-v1"), [8, 8, 8, 12], seed=0)
    table = ServerTable(env.n_states, env.n_actions)
    table.seen[:] = True
    table.q[:, 0] = 1.0  # up
    try:
        out = evaluate(table, env, 3, np.random.default_rng(0), max_steps=50)
    finally:
        env.close()
    assert out["capped"] == 3 and out["length_mean"] == 50 and out["return_mean"] == -50


# ---- real jobs ----

def _launch(tmp_path, n, *sets, timeout=240):
    args = ["launch", "-n", str(n), TAXI, "--set", f"run.out_dir={tmp_path}"]
    for s in sets:
        args += ["--set", s]
    return run_cli(*args, timeout=timeout)


def _run_dir(tmp_path):
    (run,) = [p for p in tmp_path.iterdir() if (p / "run.h5").exists()]
    return run


@pytest.mark.mpi
def test_the_default_taxi_job_runs_8_workers_and_a_server_and_info_summarises_it(tmp_path, capsys):
    proc = _launch(tmp_path, 9, "distql.episodes=150")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ranks: 0 Q-server; 1-8 workers" in proc.stdout
    run = _run_dir(tmp_path)
    with h5py.File(run / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed" and f["provenance"].attrs["torch"] == ""  # the server: no torch
    with h5py.File(run / "qserver.h5", "r") as f:
        w = f["workers"]
        byes = w["bye"][()]
        assert sorted(w["worker"][byes].tolist()) == list(range(1, 9))  # every worker said goodbye ...
        assert (w["episodes"][byes] == 150).all() and not w["torch_imported"][()].any()  # ... and imported no torch
        e = f["episodes"]
        for k in range(1, 9):
            assert sorted(e["episode"][e["worker"][()] == k].tolist()) == list(range(150))
        m = f["merges"]
        assert len(m["time"]) == 8 * 16  # after episodes 0, 10, ..., 140 and the last
        assert (m["bytes_out"][()] == 32 + 20 * m["reply_pairs"][()]).all()
        assert f["table/seen"][()].sum() == m["reply_pairs"][-1]  # ALL: the last reply was the whole final table
        assert f["table/merges"][()].sum() == m["pairs_in"][()].sum()
        assert len(f["eval"]["time"]) == 1
    info = run_cli("info", str(run))
    assert info.returncode == 0 and "1 Q-server, 8 worker(s)" in info.stdout and "merges     128" in info.stdout
    watch = run_cli("watch", str(run), "--once")
    assert watch.returncode == 0 and "1,200 of 1,200" in watch.stdout, watch.stdout
    # The table the server ended with plays (no checkpoint: the run ended) and exports; torch only in this process.
    from conftest import in_process
    from mpirl.trained.video import count_frames
    play = in_process(capsys, "play", str(run), "--episodes", "3", "--video", str(tmp_path / "taxi.mp4"))
    assert play.returncode == 0 and "qserver.h5's final table" in play.stdout, play.stdout + play.stderr
    frames = int(play.stdout.split("taxi.mp4 (")[1].split(" frames")[0])
    assert count_frames(tmp_path / "taxi.mp4") == frames > 0
    export = in_process(capsys, "export", str(run), "--out", str(tmp_path / "taxi.pt"))
    assert export.returncode == 0 and "obs [N] int64" in export.stdout, export.stdout + export.stderr


def _checkpoints(run_dir):
    return sorted((run_dir / "checkpoints").glob("ckpt-*.h5"))


def _episodes(run_dir) -> dict[int, list[int]]:
    """Each worker's episode indices as qserver.h5 holds them, in row order."""
    with h5py.File(run_dir / "qserver.h5", "r") as f:
        e = f["episodes"]
        workers, index = e["worker"][()], e["episode"][()]
    return {int(w): index[workers == w].tolist() for w in np.unique(workers)}


def _wait_for_checkpoint(job, out, seconds=180):
    """Until the run under ``out`` has a checkpoint, whatever the machine's speed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and job.proc.poll() is None:
        found = [c for run in out.glob("*/") for c in _checkpoints(run)]
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"no checkpoint within {seconds} s\n{job.head[-3000:]}")


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["SIGUSR1", "kill -9 a worker", "kill -9 the server"])
def test_a_stopped_or_killed_distql_job_resumes_and_counts_every_episode_once(tmp_path, how):
    """Ctrl-C through mpirl launch (SIGUSR1 to the job) ends it preempted (exit 75) after a last checkpoint; a kill -9
    of a worker or of the server leaves the periodic one (and perhaps a cut it had begun, which nothing reads). Either way --resume continues the same run: the merged table's counts
    only grow, each worker's episodes are 0, 1, 2, ... once each, and the run completes."""
    from test_launcher import Launched, gone
    out = tmp_path / "runs"
    sets = ["distql.workers=2", "distql.episodes=10000000", "log.flush_seconds=0.2", "distql.eval_episodes=0",
            "checkpoint.every_seconds=0.5"]
    job = Launched(out, cmd=[sys.executable, "-m", "mpirl", "launch", "-n", "3", TAXI, "--set", f'run.out_dir="{out}"',
                             *[x for s in sets for x in ("--set", s)]])
    try:
        _wait_for_checkpoint(job, out)
        if how == "SIGUSR1":
            job.signal(signal.SIGINT, terminal=True)
            code, text, _ = job.finish(120)
            assert code == 75, text[-3000:]
            assert "checkpoint written. Continue with: mpirl launch" in text
        else:
            os.kill(job.rank_pid(0 if how.endswith("server") else 2), signal.SIGKILL)
            code, text, _ = job.finish(120)
            assert code not in (0, 75), text[-3000:]
        assert gone(job.marker, 10)
    finally:
        job.kill()
    run = job.run_dir
    with h5py.File(run / "run.h5", "r") as f:
        status = f.attrs["status"]
    if how == "SIGUSR1":
        assert status == "preempted"
    else:
        assert status == "running" and "status     dead" in run_cli("info", str(run)).stdout
    last = _checkpoints(run)[-1]
    with h5py.File(last, "r") as f:
        before = f["server/merges"][()]
        at_checkpoint = {int(w): int(f[f"workers/{w}"].attrs["played"]) for w in (1, 2)}
        steps = sum(int(f[f"workers/{w}"].attrs["env_steps"]) for w in (1, 2))
    # Resume with a bound on the env steps (a stop condition may change on resume): it ends on its own.
    proc = run_cli("launch", "-n", "3", TAXI, "--set", f'run.out_dir="{out}"', *[x for s in sets for x in ("--set", s)],
                   "--set", f"run.env_steps={steps + 20_000}", "--resume", str(run), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resuming {run} from {last.name} (merges " in proc.stdout
    with h5py.File(run / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["restarts"] == 1
        assert f.attrs["stop_reason"] == f"env_steps {steps + 20_000} reached"
    with h5py.File(run / "qserver.h5", "r") as f:
        after = f["table/merges"][()]
        stats = f["workers"]
        byes = stats["bye"][()]
        final = {int(w): int(n) for w, n in zip(stats["worker"][byes], stats["episodes"][byes])}
    assert (after >= before).all() and after.sum() > before.sum()
    for w, index in _episodes(run).items():  # nothing lost, nothing twice, the resumed run went on
        assert index == list(range(len(index))) and len(index) == final[w] > at_checkpoint[w], (w, index[-5:])


@pytest.mark.mpi
def test_a_sync_run_stopped_and_resumed_ends_where_an_uninterrupted_one_does(tmp_path):
    """In sync mode a run is deterministic, and a checkpoint keeps all of it (tables, counters, the workers' and
    their environments' generators): stopped by a stop condition and resumed, it ends with the very table and
    episodes of a run that was never stopped."""
    sets = ("distql.workers=2", "distql.exchange=sync", "distql.episodes=600", "run.seed=3", "distql.eval_episodes=0")
    whole = _launch(tmp_path / "whole", 3, *sets)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    ended = _run_dir(tmp_path / "whole")  # ended by its episodes: a last checkpoint, as every stop writes one
    with h5py.File(_checkpoints(ended)[-1], "r") as ck, h5py.File(ended / "qserver.h5", "r") as f:
        assert np.array_equal(ck["server/q"][()], f["table/q"][()]) and ck["server/merges"][()].sum() > 0
        assert ck.attrs["finished"].tolist() == [1, 2] and int(ck.attrs["train_steps"]) > 0  # (merges)
    part = _launch(tmp_path / "part", 3, *sets, "run.env_steps=20000")
    assert part.returncode == 0, part.stdout[-3000:] + part.stderr[-3000:]
    run = _run_dir(tmp_path / "part")
    with h5py.File(run / "run.h5", "r") as f:
        assert f.attrs["stop_reason"] == "env_steps 20000 reached"
    assert _checkpoints(run)
    rest = run_cli("launch", "-n", "3", TAXI, "--set", f"run.out_dir={tmp_path / 'part'}",
                   *[x for s in sets for x in ("--set", s)], "--set", "run.env_steps=0", "--resume", str(run),
                   timeout=240)
    assert rest.returncode == 0, rest.stdout[-3000:] + rest.stderr[-3000:]
    got = []
    for r in (_run_dir(tmp_path / "whole"), run):
        with h5py.File(r / "qserver.h5", "r") as f:
            e = f["episodes"]
            order = np.lexsort((e["episode"][()], e["worker"][()]))
            got.append((f["table/q"][()], f["table/merges"][()], e["return"][()][order], e["episode"][()][order]))
    assert np.array_equal(got[0][0], got[1][0]) and np.array_equal(got[0][1], got[1][1])
    assert np.array_equal(got[0][2], got[1][2]) and np.array_equal(got[0][3], got[1][3])


@pytest.mark.mpi
def test_run_stop_conditions_end_a_distql_job(tmp_path):
    proc = _launch(tmp_path, 3, "distql.workers=2", "distql.episodes=10000000", "run.wall_seconds=1",
                   "distql.eval_episodes=0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with h5py.File(_run_dir(tmp_path) / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["stop_reason"] == "wall_seconds 1 reached"


@pytest.mark.mpi
def test_taxi_learns_with_two_workers(tmp_path):
    proc = _launch(tmp_path, 3, "distql.workers=2", "distql.eval_every=20")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with h5py.File(_run_dir(tmp_path) / "qserver.h5", "r") as f:
        ret = f["episodes"]["return"][()]
        ev = f["eval"]["return_mean"][()]
    assert ret[:200].mean() < -150 and ret[-400:].mean() > 0, (ret[:200].mean(), ret[-400:].mean())
    # the server's own table, played greedily: after 20 merges (~100 episodes a worker) it still loses (a greedy
    # loop until the 200-step limit is -200); at the end it delivers (Taxi's optimum is about +8 a ride). One late
    # evaluation may still meet a greedy loop from a rarely visited start (-200 in one of its episodes: async
    # merges keep changing the table), so the end is the median of the last five evaluations.
    assert ev[0] < 0 < np.median(ev[-5:]), ev


@pytest.mark.mpi
def test_sync_runs_are_deterministic_and_partial_replies_carry_the_sent_pairs(tmp_path):
    sets = ("distql.workers=2", "distql.exchange=sync", "distql.mode=partial", "distql.episodes=120",
            "run.seed=5", "distql.eval_episodes=0")
    got = []
    for k in range(2):
        out = tmp_path / str(k)
        proc = _launch(out, 3, *sets)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with h5py.File(_run_dir(out) / "qserver.h5", "r") as f:
            m = f["merges"]
            assert (m["reply_pairs"][()] == m["pairs_in"][()]).all()
            rounds, workers = m["round"][()], m["worker"][()]
            assert (np.diff(rounds) >= 0).all() and all(sorted(workers[rounds == r]) == [1, 2]
                                                        for r in np.unique(rounds))
            e = f["episodes"]
            order = np.lexsort((e["episode"][()], e["worker"][()]))
            got.append((f["table/q"][()], e["return"][()][order]))
    assert np.array_equal(got[0][0], got[1][0]) and np.array_equal(got[0][1], got[1][1])


@pytest.mark.mpi
def test_a_failing_worker_aborts_the_job(tmp_path):
    proc = _launch(tmp_path, 3, "distql.workers=2", "env.id=tests.faulty_env:FaultyTaxi-v0",
                   "distql.eval_episodes=0", timeout=120)
    assert proc.returncode != 0 and "injected failure" in proc.stdout + proc.stderr
    with h5py.File(_run_dir(tmp_path) / "run.h5", "r") as f:
        assert f.attrs["status"] == "failed" and "worker" in f.attrs["stop_reason"]


BAD = [
    (("--set", "env.id=MountainCar-v0"), "env.id: 'MountainCar-v0' has observation space"),
    (("--set", "env.id=CartPole-v1", "--set", "distql.bins=[8, 8, 8]"), "distql.bins: must be 4 bin counts"),
    (("--set", "env.id=CartPole-v1", "--set", "distql.bins=[8, 0, 8, 12]"), "distql.bins: must be a non-empty list"),
    (("--set", "env.id=CartPole-v1", "--set", "distql.bins=[1000, 1000, 1000, 1]"), "distql.bins: the table would"),
    (("--set", "distql.tau=0"), "distql.tau: must be"),
    (("--set", "distql.eta0=1.5"), "distql.eta0: must be"),
    (("--set", "distql.epsilon=0"), "distql.epsilon: must be"),
    (("-n", "4"), "world size: the job needs 1 Q-server + 8 worker(s)"),
    (("--set", "distql.worker_delay_us=[1, 2]"), "distql.worker_delay_us: must hold one value"),
    (("--set", "replay.capacity=10"), "replay.capacity: agent.algorithm = 'distql' does not use it"),
    (("--set", "topology.buffers=2"), "topology.buffers: agent.algorithm = 'distql' does not use it"),
    (("--set", "qmix.td_lambda=0.5"), "qmix.td_lambda: [qmix] belongs to agent.algorithm = 'qmix'"),
    (("--set", "run.train_steps=5"), "run.train_steps: agent.algorithm = 'distql' does not use it"),
    (("--set", "checkpoint.every_steps=5"), "checkpoint.every_steps: agent.algorithm = 'distql' does not use it"),
    (("--set", "distql.eval_max_steps=0"), "distql.eval_max_steps: must be an integer"),
]


@pytest.mark.mpi  # launch leaves the environment and the table to the job (rank 0 checks them)
@pytest.mark.parametrize("extra, message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_input_is_exit_2_naming_the_key(tmp_path, extra, message):
    proc = run_cli("launch", TAXI, "--set", f"run.out_dir={tmp_path}", *extra)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())  # nothing that looks like a run
