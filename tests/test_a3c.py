"""The gradient family (``agent.algorithm = "a3c"``): the exchanges' rules and messages without MPI, bad input, and
whole jobs (async parameter server, sync rounds with stragglers, allreduce with straggler preemption) that learn,
drop what they must, survive a killed rank and resume."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpirl import config
from mpirl.gradients import messages as msg
from mpirl.gradients.rules import Rounds, accept, preempted, quorum_of
from mpirl.job import checkpoint
from mpirl.metrics.summary import in_time_order, window_means

from conftest import JOBS, finish, ranks_of, run_cli, run_mpi, start_mpi, wait_for

JOB = JOBS / "a3c_cartpole.toml"


def load(*sets: str):
    cfg, _ = config.load(JOB, list(sets))
    return cfg


def version_of(out: Path) -> int:
    """The updates the run under ``out`` has written so far (0 before its first row)."""
    for f in Path(out).glob("*/updates.h5"):
        with h5py.File(f, "r", locking=False) as h:
            v = h["updates/version"][()]
            return int(v[-1]) if len(v) else 0
    return 0


# ---------------------------------------------------------------- rules, no MPI
def test_async_applies_gradients_up_to_max_staleness_and_drops_older_ones():
    assert accept(10, 10, 0) == (True, 0)
    assert accept(10, 7, 3) == (True, 3)
    assert accept(10, 6, 3) == (False, 4)
    with pytest.raises(ValueError, match="future"):
        accept(3, 4, 10)


def test_a_sync_round_closes_at_workers_minus_stragglers_and_drops_a_closed_rounds_gradient():
    r = Rounds(4, 1)
    assert r.offer(3, 0, 0) and not r.ready()
    assert r.offer(1, 0, 0) and not r.ready()
    assert r.offer(4, 0, 0) and r.ready()
    assert r.close() == [1, 3, 4]  # rank order, whatever order they came in
    assert not r.offer(2, 0, 1) and r.members == []  # the straggler's gradient of version 0, at version 1: dropped
    with pytest.raises(RuntimeError, match="two gradients"):
        r.offer(1, 1, 1)
        r.offer(1, 1, 1)
    with pytest.raises(ValueError):
        Rounds(2, 2)


def test_no_stragglers_means_every_worker_is_waited_for():
    r = Rounds(3, 0)
    for w in (1, 2):
        r.offer(w, 5, 5)
    assert not r.ready()
    r.offer(3, 5, 5)
    assert r.ready()


@pytest.mark.parametrize("W,frac,quorum", [(4, 0.6, 3), (5, 0.6, 3), (10, 0.6, 6), (8, 1.0, 8), (3, 0.01, 1)])
def test_dd_ppo_preempts_once_sync_frac_of_the_workers_are_done_and_a_quarter_is_played(W, frac, quorum):
    assert quorum_of(W, frac) == quorum
    assert not preempted(quorum - 1, W, frac, steps=100, min_steps=5)
    assert preempted(quorum, W, frac, steps=5, min_steps=5) == (quorum < W)  # sync_frac 1: never
    assert not preempted(quorum, W, frac, steps=4, min_steps=5)  # not before its minimum of steps


def test_a_message_and_a_reply_round_trip():
    n = 7
    buf = np.zeros(msg.message_nbytes(n, 5), np.uint8)
    grad = np.arange(n, dtype=np.float32) - 3
    stats = {"loss": 1.5, "entropy": 0.25}
    k = msg.pack(buf, msg.GRAD, 12, 3, 400, 9, stats, np.array([10.0, 20.0]), np.array([10, 20]), grad)
    assert k == msg.HEAD + 2 * 16 + 4 * n
    m = msg.unpack(buf, k)
    assert (m.kind, m.version, m.rollout, m.env_steps, m.episodes) == (msg.GRAD, 12, 3, 400, 9)
    assert m.stats["loss"] == 1.5 and m.stats["entropy"] == 0.25 and m.stats["grad_norm"] == 0.0
    assert m.returns.tolist() == [10.0, 20.0] and m.lengths.tolist() == [10, 20] and np.array_equal(m.grad, grad)
    hello = msg.unpack(buf, msg.pack(buf, msg.HELLO, 0, 0, 0, 0, {}, np.zeros(0), np.zeros(0), None))
    assert hello.kind == msg.HELLO and len(hello.grad) == 0 and len(hello.returns) == 0
    back = np.zeros(msg.reply_nbytes(n), np.uint8)
    nbytes, params = msg.pack_reply(back, 13, False, True, n, env_steps=77, episodes=4)
    params[:] = grad * 2
    assert nbytes == msg.reply_nbytes(n)
    r = msg.unpack_reply(back, n)
    assert (r.version, r.stop, r.dropped, r.env_steps, r.episodes) == (13, False, True, 77, 4)
    assert np.array_equal(r.params, grad * 2)


# ---------------------------------------------------------------- bad input
def _refusal(n: int, *sets: str) -> config.ConfigError:
    from mpirl.registry import algorithm
    with pytest.raises(config.ConfigError) as err:
        cfg = load(*sets)
        algorithm("a3c").check(cfg, n, str(JOB))
    return err.value


@pytest.mark.parametrize("n,sets,key", [
    (5, ['a3c.exchange="sync"', "a3c.stragglers=4"], "a3c.stragglers"),
    (5, ['a3c.exchange="sync"', "a3c.stragglers=7"], "a3c.stragglers"),
    (5, ["a3c.stragglers=1"], "a3c.stragglers"),  # async has no rounds
    (4, ['a3c.exchange="allreduce"', "a3c.sync_frac=0"], "a3c.sync_frac"),
    (4, ['a3c.exchange="allreduce"', "a3c.sync_frac=1.5"], "a3c.sync_frac"),
    (4, ['a3c.exchange="allreduce"', "a3c.sync_frac=nan"], "a3c.sync_frac"),
    (5, ["a3c.max_staleness=-1"], "a3c.max_staleness"),
    (5, ["a3c.epochs=4"], "a3c.epochs"),  # a2c: one gradient a rollout
    (5, ['a3c.loss="ppo"', "a3c.minibatches=200"], "a3c.minibatches"),
    (4, ['a3c.exchange="allreduce"', 'a3c.loss="ppo"', "a3c.minibatches=64"], "a3c.minibatches"),
    (5, ["a3c.workers=2"], "world size"),
    (1, [], "world size"),
    (5, ["a3c.worker_delay_us=[0, 0]"], "a3c.worker_delay_us"),
    (5, ['a3c.exchange="dpp"'], "a3c.exchange"),
    (5, ['env.id="tests.odd_spaces_env:DictActions-v0"'], "env.id"),
    (5, ["impala.unroll=20"], "impala"),
    (5, ["replay.batch_size=64"], "replay.batch_size"),
    (5, ["run.wall_seconds=0", "run.target_return=475"], "run"),
])
def test_bad_a3c_input_is_refused_naming_the_key(n, sets, key):
    err = _refusal(n, *sets)
    assert key in f"{err.key}: {err.message}", (err.key, err.message)


def test_bad_a3c_input_is_exit_2_from_the_command_line():
    proc = run_cli("validate", str(JOB), "-n", "5", "--set", 'a3c.exchange="sync"', "--set", "a3c.stragglers=4")
    assert proc.returncode == 2 and "a3c.stragglers" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- whole jobs
def _read(run_dir: Path) -> dict:
    out: dict = {"workers": {}}
    with h5py.File(run_dir / "run.h5", "r") as f:
        out["status"], out["reason"] = f.attrs["status"], f.attrs["stop_reason"]
        u = f["updates/updates"]
        out["updates"] = {k: u[k][()] for k in u}
        out["test"] = {k: f["updates/test"][k][()] for k in f["updates/test"]}
        for name in f:
            if name.startswith("worker_"):
                ro, ep = f[name]["rollouts"], f[name]["episodes"]
                out["workers"][int(name[7:])] = {"rollouts": {k: ro[k][()] for k in ro},
                                                 "returns": ep["return"][()], "time": ep["time"][()],
                                                 "attrs": dict(f[name].attrs)}
    return out


def _returns_rose(r: dict) -> None:
    """From random play to well above it, read from the workers' own files: their first 20 episodes (by time) near
    random play, and some 20 in a row well above it. Not their last 20: the stop's window counts episodes as they
    reach the deciding rank, and the workers go on playing until the stop reaches them, with a policy that may already
    be falling (asynchronous A2C's can, docs/a3c.md). On a loaded machine that tail ran long enough once here
    for the last 20 to average 118 (32 to 368) after the window had reached 195."""
    _, ret = in_time_order(list(r["workers"].values()), "returns")
    best = window_means(ret, 20).max()
    assert ret[:20].mean() < 60 and best >= 150, (ret[:20].mean(), best, ret[-20:].mean())


LEARN = ("run.wall_seconds=0", "run.env_steps=2000000")


@pytest.mark.learning
@pytest.mark.mpi
# Two of the four exchange x loss pairs (the suite's time): async's staleness, and allreduce's identical parameters
# and lockstep with PPO's epochs; sync and allreduce with A2C reach 475 in docs/a3c.md's runs and their rules are
# tested below on short jobs.
@pytest.mark.parametrize("exchange,loss", [("async", "a2c"), ("allreduce", "ppo")])
def test_the_gradient_family_learns_cartpole(tmp_path, exchange, loss):
    """Every rank exits 0 and returns rise from random play (about 22) to 195 over 20 episodes (this machine: 475
    in 7-15 s with every exchange when nothing else runs). What each exchange promises shows in
    the files: async applies gradients a few updates stale, allreduce keeps every rank's parameters identical and its
    ranks in lockstep; PPO makes epochs x minibatches gradients a rollout. (Sync's rounds: the straggler test.)"""
    ppo = ['a3c.loss="ppo"', "a3c.epochs=2", "a3c.minibatches=2", "a3c.gae_lambda=0.95"] if loss == "ppo" else []
    n = 4 if exchange == "allreduce" else 5
    # allreduce without preemption (sync_frac 1): every rollout full length, so the run is the same however loaded the
    # machine is (with the job's 0.6, which rollouts are cut depends on the load); preemption has its own tests below.
    steady = ["a3c.sync_frac=1.0"] if exchange == "allreduce" else []
    # Both stop at 195, eight times random play (docs/a3c.md's runs go on to 475: async took 77 s and 46 CPU-s to
    # get there in the suite, where the staleness rule below holds at any target); allreduce's run is the same
    # everywhere and its policy at 195 plays 212 (asserted below).
    target = 195
    job = run_mpi(n, tmp_path, *LEARN, f"run.target_return={target}", f'a3c.exchange="{exchange}"',
                  "a3c.check_every=10", *ppo, *steady, job=JOB, timeout=1800, stall=300)
    assert job.proc.returncode == 0, job.output
    r = _read(job.run_dir)
    assert r["status"] == "completed" and f"reached {target}" in r["reason"], (r["reason"], job.output[-2000:])
    _returns_rose(r)
    u = r["updates"]
    assert np.all(np.diff(u["version"]) >= 0) and u["applied"].any()
    if exchange == "async":
        ok = u["applied"]  # the rule, whatever the load: applied at most max_staleness (32) old, dropped beyond
        assert u["staleness"][ok].max() >= 1 and u["staleness"][ok].max() <= 32
        assert np.all(u["staleness"][~ok] > 32) and u["dropped"][-1] == (~ok).sum()
        assert set(u["worker"].tolist()) == {1, 2, 3, 4}  # a row a gradient, each worker's
    else:
        crcs = {w["attrs"]["params_crc32"] for w in r["workers"].values()}
        versions = {int(w["attrs"]["version"]) for w in r["workers"].values()}
        assert len(crcs) == 1 and len(versions) == 1, (crcs, versions)  # identical parameters on every rank
        rollouts = [w["rollouts"] for w in r["workers"].values()]
        assert len({len(ro["rollout"]) for ro in rollouts}) == 1  # they move in lockstep
    per_rollout = 4 if loss == "ppo" else 1
    for w in r["workers"].values():
        ro = w["rollouts"]
        assert ro["gradients"][-1] <= per_rollout * len(ro["rollout"])
        assert ro["gradients"][-1] >= per_rollout * (len(ro["rollout"]) - 1)
    test = r["test"]
    # the round ran: 10 games, each CartPole step worth 1, so the mean return is the mean length (8 to 500 steps)
    assert test["episodes"].tolist() == [10] and test["return_mean"][0] == test["length_mean"][0] >= 8, test
    if exchange == "allreduce":
        assert test["return_mean"][0] > 60, test  # the final policy, the same in every run: 212
    # Async's final policy is not asserted: the window decides the stop, and its 20 episodes (up to 500 steps each)
    # were played over the last ~120 updates, so a policy that collapses in those updates can still stop the run.
    # docs/a3c.md counts how often: 1 final test round near random play in 81 runs to 475 on this 2-core VM.


@pytest.mark.mpi
def test_sync_with_a_straggler_left_behind_drops_its_gradients_and_the_rounds_go_on(tmp_path):
    """D = 1 and worker 4 slowed: rounds close on the three fast workers' gradients, the slow one's arrive after
    its round closed and are dropped (counted on both sides). Its delay, 20 ms a step (0.32 s a rollout of 16
    steps, asleep), keeps it the slowest on a loaded machine too: at 3 ms a step a CI machine's load slowed the fast
    workers as much (143 rollouts against the slow one's 150)."""
    job = run_mpi(5, tmp_path, "run.wall_seconds=0", "run.target_return=nan", "run.train_steps=150",
                  'a3c.exchange="sync"', "a3c.stragglers=1", "a3c.worker_delay_us=[0, 0, 0, 20000]", job=JOB,
                  timeout=300)
    assert job.proc.returncode == 0, job.output
    r = _read(job.run_dir)
    assert r["reason"] == "train_steps 150 reached"
    u = r["updates"]
    assert u["version"][-1] == 150 and np.all(u["gradients"] >= 3) and np.all(u["staleness"] == 0)  # never stale
    slow = r["workers"][4]["rollouts"]
    assert slow["dropped"][-1] >= 1 and u["dropped"][-1] >= slow["dropped"][-1]
    fast = r["workers"][1]["rollouts"]
    assert len(fast["rollout"]) > len(slow["rollout"])  # the fast ones were not held back
    info = run_cli("info", str(job.run_dir))  # the per-rank table says the same
    assert info.returncode == 0, info.stderr
    lines = info.stdout.splitlines()
    top = next(i for i, line in enumerate(lines) if line.split()[:2] == ["rank", "rollouts"])
    rows = {int(line.split()[0]): line.split() for line in lines[top + 1:top + 5]}
    assert sorted(rows) == [1, 2, 3, 4], info.stdout
    assert [int(rows[4][k].replace(",", "")) for k in (1, 7)] == [len(slow["rollout"]), slow["dropped"][-1]]


@pytest.mark.mpi
def test_async_with_max_staleness_0_drops_every_gradient_that_lost_the_race(tmp_path):
    """Also on games that raise (every 400th step of a process): the workers rebuild them, count it and go on. (Two
    workers race enough: each one's gradient is stale whenever the other's landed first.)"""
    job = run_mpi(3, tmp_path, "run.wall_seconds=0", "run.target_return=nan", "run.train_steps=200",
                  "a3c.max_staleness=0", "env.id=tests.faulty_env:FlakyCartPole-v0", job=JOB, timeout=300)
    assert job.proc.returncode == 0, job.output
    r = _read(job.run_dir)
    u = r["updates"]
    applied = u["applied"]
    assert u["version"][-1] == 200 and applied.sum() == 200
    assert (~applied).sum() == u["dropped"][-1] > 0 and np.all(u["staleness"][applied] == 0)
    assert np.all(u["staleness"][~applied] >= 1)
    with h5py.File(job.run_dir / "updates.h5", "r") as f:  # what serving cost (the scaling model's server time)
        assert f.attrs["loop_updates"] == 200 and 0 < f.attrs["busy_s"] < f.attrs["loop_s"]
    assert "raised ValueError: injected flaky failure in env.step; rebuilding its environments" in job.output
    for w in r["workers"].values():
        ro = w["rollouts"]
        assert ro["env_errors"][-1] >= ro["env_steps"][-1] // 400 - 1 and ro["env_errors"][-1] >= 1, ro


@pytest.mark.mpi
def test_allreduce_without_preemption_never_cuts_a_rollout(tmp_path):
    """sync_frac 1 and worker 1 of 2 slowed: every rollout still runs its 16 steps."""
    job = run_mpi(2, tmp_path, "run.wall_seconds=0", "run.target_return=nan", "run.train_steps=100",
                  'a3c.exchange="allreduce"', "a3c.sync_frac=1.0", "a3c.worker_delay_us=[0, 2000]",
                  job=JOB, timeout=300)
    assert job.proc.returncode == 0, job.output
    r = _read(job.run_dir)
    for w in r["workers"].values():
        ro = w["rollouts"]
        assert not ro["preempted"].any() and np.all(ro["steps"] == 16)


@pytest.mark.mpi
def test_ppo_under_allreduce_stops_at_exactly_train_steps_mid_rollout(tmp_path):
    """4 gradients a rollout (2 epochs x 2 minibatches), 30 updates: every rank (of 2) stops updating at 30,
    mid-rollout."""
    job = run_mpi(2, tmp_path, "run.wall_seconds=0", "run.target_return=nan", "run.train_steps=30",
                  'a3c.exchange="allreduce"', 'a3c.loss="ppo"', "a3c.epochs=2", "a3c.minibatches=2", job=JOB,
                  timeout=300)
    assert job.proc.returncode == 0, job.output
    r = _read(job.run_dir)
    assert r["reason"] == "train_steps 30 reached" and r["updates"]["version"][-1] == 30
    assert {int(w["attrs"]["version"]) for w in r["workers"].values()} == {30}
    assert all(w["rollouts"]["gradients"][-1] == 30 for w in r["workers"].values())


@pytest.mark.mpi
def test_allreduce_preempts_the_straggler_rollouts(tmp_path):
    """Worker 3 slowed: the three others finish, so 3 >= ceil(0.6 x 4) and the slow one ends its rollouts early
    (after at least a quarter of them, 4 of 16 steps)."""
    job = run_mpi(4, tmp_path, "run.wall_seconds=0", "run.target_return=nan", "run.train_steps=100",
                  'a3c.exchange="allreduce"', "a3c.worker_delay_us=[0, 0, 0, 2000]", job=JOB, timeout=300)
    assert job.proc.returncode == 0, job.output
    slow = _read(job.run_dir)["workers"][3]["rollouts"]
    cut = slow["preempted"]
    assert cut.any(), slow  # (how many depends on the machine's load: this one cut 43-90 %)
    assert np.all(slow["steps"][cut] >= 4) and np.all(slow["steps"][cut] < 16)


@pytest.mark.mpi
@pytest.mark.parametrize("exchange,rank", [("async", 0), ("async", 2), ("allreduce", 1)])
def test_a_killed_rank_ends_the_job_and_resume_continues(tmp_path, exchange, rank):
    """kill -9 of the server or a worker: the job ends (never a hang) with the periodic checkpoint; --resume
    continues to the end from it, the updates one axis. (Two workers: each rank's torch start-up, twice a test, is
    most of what the test costs.)"""
    out = tmp_path / "runs"
    n = 2 if exchange == "allreduce" else 3
    sets = ("run.target_return=nan", "run.wall_seconds=0", "checkpoint.every_steps=25", "log.flush_seconds=0.2",
            f'a3c.exchange="{exchange}"')
    with start_mpi(n, out, "run.train_steps=1000000", *sets, job=JOB) as job:
        wait_for(job, lambda: version_of(out) >= 40, "40 updates (a checkpoint at 25)")
        os.kill(ranks_of(job.pid)[rank], signal.SIGKILL)
        code, text = finish(job, 120)
    assert code != 0 and f"rank {rank}" in text and "signal 9" in text, text[-3000:]
    run_dir = next(out.glob("*/run.h5")).parent
    done = int(checkpoint.checkpoints(run_dir)[-1].name[5:15])
    assert done >= 25
    steps = done + 40
    job = run_mpi(n, out, f"run.train_steps={steps}", *sets, job=JOB, args=("--resume", str(run_dir)))
    assert job.proc.returncode == 0, job.output
    r = _read(run_dir)
    assert r["status"] == "completed" and r["reason"] == f"train_steps {steps} reached"
    v = r["updates"]["version"]
    assert np.all(np.diff(v) >= 0) and v[-1] == steps and v[0] <= done  # one axis, no gap
    for w in r["workers"].values():
        assert np.all(np.diff(w["rollouts"]["env_steps"]) > 0)  # each worker's counters continue


@pytest.mark.mpi
def test_a_preempted_allreduce_job_checkpoints_and_resumes(tmp_path):
    """SIGUSR1 to mpiexec: every rank stops at the same update, rank 0 writes the checkpoint, exit 75."""
    out = tmp_path / "runs"
    sets = ("run.target_return=nan", "run.wall_seconds=0", 'a3c.exchange="allreduce"')
    with start_mpi(4, out, "run.train_steps=1000000", *sets, job=JOB) as job:
        wait_for(job, lambda: version_of(out) >= 50, "50 updates", timeout=300)
        os.kill(job.pid, signal.SIGUSR1)
        code, text = finish(job, 120)
    assert code == 75, text[-3000:]
    run_dir = next(out.glob("*/run.h5")).parent
    done = int(checkpoint.checkpoints(run_dir)[-1].name[5:15])
    r = _read(run_dir)
    assert r["status"] == "preempted" and done == r["updates"]["version"][-1] >= 50
    job = run_mpi(4, out, f"run.train_steps={done + 30}", *sets, job=JOB, args=("--resume", str(run_dir)))
    assert job.proc.returncode == 0, job.output
    assert _read(run_dir)["updates"]["version"][-1] == done + 30
