"""Whole jobs under mpiexec: both architectures, two buffers, bad input, a failing rank.

Each test starts mpiexec in a subprocess with a timeout and checks the exit code
and what the run wrote to HDF5.
"""

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from mpirl.config import ReplayConfig
from mpirl.metrics.summary import summarize

from conftest import JOBS, ROOT, mpi_env, processes_mentioning, run_cli, run_mpi, wait_for

pytestmark = pytest.mark.mpi

SHORT = ("run.train_steps=600", "run.target_return=nan", "replay.learning_starts=500")


def read(run_dir, path):
    with h5py.File(run_dir / "run.h5", "r") as f:
        return f[path][()]


def check_common(job, n_buffers):
    assert job.proc.returncode == 0, job.output
    run_dir = job.run_dir
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed"
        assert "train_steps 600 reached" in f.attrs["stop_reason"]
        assert f["job"].attrs["topology.buffers"] == n_buffers
        train = f["learner/train"]
        assert train["train_steps"][-1] == 600
        np.testing.assert_array_equal(f["learner/batches/train_step"][()], np.arange(1, 601))  # every batch
        assert train["samples_trained"][-1] == 600 * 64
        assert train["bytes_in"][-1] > 0 and train["compute_s"][-1] > 0 and train["comm_s"][-1] > 0
        assert np.isfinite(train["loss"][()]).any()
        buffers = [k for k in f if k.startswith("buffer_")]
        assert len(buffers) == n_buffers
        for b in buffers:
            t = f[b]["buffer"]
            assert t["experiences_in"][-1] > 0 and t["fill"][-1] > 0 and t["bytes_in"][-1] > 0
            assert f[b]["episodes"]["return"].shape[0] > 0
            assert set(f[b]["actors"]["actor"][()]) == set(f[b].attrs["actors"])
            # CartPole's vector observations: the actors' network in numpy (mpirl/agents/acting.py), torch never
            # imported on their ranks
            assert not f[b]["actors"]["torch_imported"][()].any()
    s = summarize(run_dir)
    assert s["status"] == "completed"
    return run_dir, s


@pytest.fixture(scope="module")
def proposed(tmp_path_factory):
    """The proposed placement with a small shard, so slots are overwritten while their priorities are in flight, and
    three games per actor: the module's job for both."""
    out = tmp_path_factory.mktemp("proposed")
    yield run_mpi(4, out, *SHORT, "replay.capacity=600", "env.envs_per_actor=3")
    shutil.rmtree(out, ignore_errors=True)


def test_proposed_replay_on_the_buffer(proposed):
    run_dir, s = check_common(proposed, 1)
    with h5py.File(run_dir / "run.h5", "r") as f:
        buf = f["buffer_1/buffer"]
        # Priorities flowed back: one update per trained sample that came back with a later request.
        assert buf["priority_updates"][-1] >= (600 - 3) * 64
        assert buf["stale_updates"][-1] > 0  # overwritten slots were guarded
        assert buf["fill"][-1] == 600
        assert buf["consumed"][-1] > 0 and np.isfinite(buf["alpha"][-1])
        assert buf["bytes_out"][-1] > 600 * 64 * 50  # batches crossed buffer -> learner
        train = f["learner/train"]
        assert np.nanmean(train["p_t"][()]) > 0
        np.testing.assert_allclose(train["p_t"][()], train["p_s"][()], equal_nan=True)  # the batch is what crossed
    assert 0 < s["learner"]["comm_fraction"] < 1


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The baseline placement, a refresh every 50 batches, its dumps (a few thousand CartPole experiences, ~50 B each)
    in 0.05 MiB pieces, zstd on the link: the module's job for both."""
    out = tmp_path_factory.mktemp("baseline")
    yield run_mpi(4, out, *SHORT, "replay.architecture=baseline", "replay.n_replay=50", "comm.max_message_mb=0.05",
                  "comm.link.compression=zstd")
    shutil.rmtree(out, ignore_errors=True)


def test_baseline_replay_on_the_learner(baseline):
    run_dir, s = check_common(baseline, 1)
    with h5py.File(run_dir / "run.h5", "r") as f:
        buf = f["buffer_1/buffer"]
        assert buf["priority_updates"][-1] == 0  # priorities stay on the learner
        # obs 16 + action 8 + reward 4 + next_obs 16 + done 1 + discount 4 + priority 4 + version 8
        assert f["buffer_1"].attrs["bytes_per_slot"] == 61
        # Each refresh ships the whole memory: far more bytes than the batches trained on (before compression).
        assert f["learner/train/bytes_in_raw"][-1] > buf["experiences_in"][-1] * 50
        assert buf["bytes_out"][-1] == f["learner/train/bytes_in"][-1]
    assert s["learner"]["bytes_per_sample"] > 0


RATIO = 8  # replay.samples_per_insert of the two-buffer job


@pytest.fixture(scope="module")
def two_buffers(tmp_path_factory):
    """Two buffers, uneven groups (2 actors on one, 1 on the other), samples_per_insert = RATIO: the module's job
    for both."""
    out = tmp_path_factory.mktemp("two-buffers")
    yield run_mpi(6, out, *SHORT, "topology.buffers=2", f"replay.samples_per_insert={RATIO}")
    shutil.rmtree(out, ignore_errors=True)


def test_two_buffers_share_the_batch(two_buffers):
    run_dir, s = check_common(two_buffers, 2)
    with h5py.File(run_dir / "run.h5", "r") as f:
        actors = {b: list(f[b].attrs["actors"]) for b in ("buffer_1", "buffer_2")}
        assert sorted(len(a) for a in actors.values()) == [1, 2]  # 3 actors over 2 buffers
        for b in actors:
            # N/R = 32 samples of every batch came from each shard, and their priorities went back there.
            assert f[b]["buffer/consumed"][-1] >= (600 - 3) * 32
            assert f[b]["buffer/priority_updates"][-1] >= (600 - 3) * 32


def test_world_size_mismatch_exits_2_without_a_run(tmp_path):
    job = run_mpi(3, tmp_path, *SHORT, "topology.buffers=2", timeout=180)
    assert job.proc.returncode == 2
    assert "world size" in job.output and "mpirl launch -n 7" in job.output
    assert "Traceback" not in job.output
    assert job.run_dirs == []


def test_unknown_env_exits_2(tmp_path):
    job = run_mpi(4, tmp_path, *SHORT, "env.id=CartPol-v1", timeout=180)
    assert job.proc.returncode == 2
    assert "env.id: unknown environment 'CartPol-v1'; did you mean CartPole-v1" in job.output
    assert job.output.count("mpirl: error") == 1 and job.run_dirs == []


def test_bad_key_from_launch_and_validate(tmp_path):
    for cmd in (("launch", "jobs/cartpole.toml"), ("validate", "jobs/cartpole.toml")):
        proc = run_cli(*cmd, "--set", "replay.capcity=10", "--set", f'run.out_dir="{tmp_path}"')
        assert proc.returncode == 2, proc.stdout + proc.stderr
        keys = ", ".join(f.name for f in dataclasses.fields(ReplayConfig))  # the message lists every key
        assert proc.stderr.strip().splitlines() == [
            f"mpirl: error: replay.capcity: unknown key (did you mean 'capacity'?); [replay] takes {keys}"]
        assert keys.startswith("architecture, capacity, batch_size") and "samples_per_insert" in keys
    assert list(tmp_path.iterdir()) == []
    proc = run_cli("validate", "jobs/cartpole.toml", "-n", "6", "--set", "topology.buffers=2")
    assert proc.returncode == 0 and "3 actor(s)" in proc.stdout


def test_a_failing_rank_aborts_the_job_instead_of_hanging(tmp_path):
    job = run_mpi(4, tmp_path, "run.train_steps=100000", "env.id=tests.faulty_env:FaultyCartPole-v0", timeout=240)
    assert job.proc.returncode != 0
    assert "injected failure in env.step" in job.output and "rank" in job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:  # written by the failing rank, not rank 0
        assert f.attrs["status"] == "failed" and f.attrs["failed_role"] == "actor", dict(f.attrs)
        rank = int(f.attrs["failed_rank"])
        assert rank in (2, 3) and f.attrs["stop_reason"].startswith(f"failed on rank {rank} (actor): "), dict(f.attrs)
    info = run_cli("info", str(job.run_dir))
    assert f"status        failed (failed on rank {rank} (actor): " in info.stdout


def test_files_stay_readable_after_kill_9(tmp_path):
    from conftest import ranks_of, start_mpi, wait_for

    def learner_rows() -> int:
        runs = list(tmp_path.glob("*/run.h5"))
        learner = summarize(runs[0].parent)["learner"] if runs else None
        return learner["rows"] if learner else 0
    with start_mpi(4, tmp_path, "run.target_return=nan", "log.interval=0.2", "log.flush_seconds=0.5") as job:
        wait_for(job, lambda: learner_rows() >= 5, "5 learner rows")
        pids = list(ranks_of(job.pid).values())
        os.killpg(job.pid, signal.SIGKILL)  # every rank and mpiexec, no goodbye
        job.proc.wait(timeout=30)
    deadline = time.time() + 120  # SIGKILLed ranks may take a moment to leave the process table
    while time.time() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in pids):
        time.sleep(0.1)
    run_dir = next(tmp_path.glob("*/run.h5")).parent
    s = summarize(run_dir)
    # run.h5 still says running (no rank lived to say otherwise); its heartbeat says dead, never finished
    assert s["status"] == "dead" and s["end_time"] is None and s["stop_reason"].startswith("no heartbeat for "), s
    assert s["learner"]["rows"] >= 5 and s["buffers"][0]["experiences_in"] > 0
    assert all(v == "ok" for v in s["files"].values()), s["files"]
    info = run_cli("info", str(run_dir))
    assert info.returncode == 0 and "status        dead (no heartbeat for " in info.stdout, info.stdout
    watch = run_cli("watch", str(run_dir), "--interval", "0.1")  # ends by itself on a dead run
    assert watch.returncode == 0 and "status dead (no heartbeat for " in watch.stdout


def test_cuda_requested_without_a_gpu_exits_2(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    job = run_mpi(4, tmp_path, *SHORT, "agent.device=cuda", timeout=180)
    assert job.proc.returncode == 2, job.output
    assert job.output.count("mpirl: error: agent.device: 'cuda' but the learner's node") == 1
    assert job.run_dirs == []


def test_several_envs_per_actor(proposed):
    run_dir, s = check_common(proposed, 1)
    assert s["episodes"]["count"] > 0 and s["learner"]["env_steps"] > 0
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f["job"].attrs["env.envs_per_actor"] == 3


def test_bad_command_lines_exit_2(tmp_path):
    cases = [(("lauch", "jobs/cartpole.toml"), "invalid choice: 'lauch'"),
             (("validate", "jobs/cartpole.toml", "--set", "replay.architecture"), "section.key=value"),
             (("validate", "jobs/nope.toml"), "job file 'jobs/nope.toml' not found"),
             (("validate", "jobs/cartpole.toml", "-n", "2"), "world size"),
             (("info", str(tmp_path)), "holds no run.h5")]
    for args, words in cases:
        proc = run_cli(*args)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_long_haul_link_delays_every_batch(tmp_path):
    # prefetch 0: every batch is one request/reply round trip over a 10 ms (one-way) link.
    # One-sided check: noise can only make a run slower than the emulated physics, never faster.
    job = run_mpi(4, tmp_path, "run.train_steps=100", "run.target_return=nan", "replay.learning_starts=200",
                  "comm.prefetch=0", "comm.link.latency_ms=10", "comm.link.bandwidth_gbps=1")
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        t = f["learner/train"]
        assert t["train_steps"][-1] == 100
        assert t["comm_s"][-1] >= 100 * 0.020  # at least one 20 ms round trip per batch
        assert f["job"].attrs["comm.link.latency_ms"] == 10.0


@pytest.fixture(scope="module")
def breakout(tmp_path_factory):
    """Breakout at a 2-core scale, proposed placement, without the learner's frame cache (whose replies carry less:
    tests/test_frame_cache.py), zstd and 1 ms on the learner's link: the module's job for both."""
    out = tmp_path_factory.mktemp("breakout")
    yield run_mpi(4, out, "run.train_steps=20", "replay.learning_starts=300", "replay.capacity=2048",
                  "env.envs_per_actor=2", "replay.frame_cache=0", "comm.link.compression=zstd",
                  "comm.link.latency_ms=1", job=JOBS / "breakout_proposed_small.toml", timeout=240)
    shutil.rmtree(out, ignore_errors=True)


def test_atari_frames_stay_uint8_end_to_end(breakout):
    job = breakout
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        t = f["learner/train"]
        assert t["train_steps"][-1] == 20
        # Frames once on both wires. Per experience that crossed buffer -> learner (as packed, before zstd): 45 B
        # of ids, versions, probs, priority, action, reward, done, discount, 32 B of frame indices, and its share of
        # the batch's distinct uint8 frames of 7,056 B: at least one and at most 8 (56,448 B as stacks; float32
        # would be 4x). The batches in flight at the stop (prefetch 2 + 1) crossed too: in the file's totals.
        n = int(f["learner"].attrs["batch_size"])
        trained = t["train_steps"][-1] * n
        raw = t["bytes_in_raw"][-1]
        assert (77 + 7_056) * trained <= raw <= (77 + 8 * 7_056) * trained + 2_000 * (trained // n)
        assert raw < 0.9 * 56_493 * trained  # small replays share frames within a batch
        crossed, total = trained + 3 * n, f["learner"].attrs["bytes_in_raw"]
        assert (77 + 7_056) * crossed <= total <= (77 + 8 * 7_056) * crossed + 2_000 * (crossed // n)
        # Actor -> buffer: each new frame once, about one frame a transition (short episodes add reset stacks).
        b = f["buffer_1/buffer"]
        assert b["bytes_in"][-1] / b["experiences_in"][-1] < 1.3 * 7_056 + 200, b["bytes_in"][-1] / b["experiences_in"][-1]
        assert f["learner"].attrs["n_params"] > 3_000_000  # the Nature-CNN dueling network
        # The shard keeps each distinct frame once: at most 16 KB a slot, not 56 KB of stacks.
        assert f["buffer_1"].attrs["dedup_frames"]
        assert f["buffer_1"].attrs["bytes_per_slot"] <= 16_384 * f["buffer_1/buffer/fill"][-1] / 2048


def test_atari_baseline_dumps_carry_each_frame_once(tmp_path):
    # 20 train steps, a dump every 10: two dumps (14.5 -> 11.4 CPU-s idle against 40 and 20, the same two)
    job = run_mpi(4, tmp_path, "run.train_steps=20", "replay.learning_starts=300", "replay.capacity=1024",
                  "replay.n_replay=10", "env.envs_per_actor=2", job=JOBS / "breakout_baseline_small.toml",
                  timeout=240)
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        t, b = f["learner/train"], f["buffer_1/buffer"]
        assert t["train_steps"][-1] == 20 and np.isfinite(t["loss"][()]).any()
        assert b["bytes_out"][-1] == t["bytes_in"][-1] > 0
        # Two or more dumps of up to 1,024 slots went out; as stacks each slot would be 56,493 B.
        # With each frame once a slot costs about one 7,056 B frame plus 45 B of the rest.
        assert f["buffer_1"].attrs["bytes_per_slot"] <= 16_384
        dumps = t["bytes_in"][-1] / max(b["fill"][-1], 1)
        assert dumps < 2 * 16_384 * 3, dumps  # at most 3 dumps' worth, each far below 56 KB a slot


def test_rate_shares_follow_the_faster_shard(tmp_path):
    # 3 actors over 2 buffers: buffer 1 gets two actors, buffer 2 one, so it fills about half as fast.
    job = run_mpi(6, tmp_path, "run.train_steps=1500", "run.target_return=nan", "replay.learning_starts=500",
                  "topology.buffers=2", "replay.shares=rate", "log.interval=0.5")
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        shards = f["learner/shards"]
        buf, quota, rate = shards["buffer"][()], shards["quota"][()], shards["inserted_per_s"][()]
        last = {b: quota[buf == b][-1] for b in (1, 2)}
        assert last[1] + last[2] == 64
        fast = {b: rate[buf == b][-1] for b in (1, 2)}  # the rates those quotas were computed from
        assert np.isfinite(fast[1]) and np.isfinite(fast[2])
        assert (last[1] - last[2]) * (fast[1] - fast[2]) >= 0, (last, fast)  # the faster shard never gets less (a tie
        # when the rates were within a sample a second of each other: the next line pins the quota to the rates)
        assert abs(last[1] / 64 - 1 / 64 - 62 / 64 * fast[1] / (fast[1] + fast[2])) < 2 / 64
        assert f["buffer_1/buffer/consumed"][-1] + f["buffer_2/buffer/consumed"][-1] == 1500 * 64


def test_zstd_on_the_link_cuts_wire_bytes_not_data(breakout):
    job = breakout
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        t, b, totals = f["learner/train"], f["buffer_1/buffer"], f["learner"].attrs
        raw, wire = totals["bytes_in_raw"], totals["bytes_in"]  # at the stop: with the replies in flight then
        assert wire == b["bytes_out"][-1] and raw == b["bytes_out_raw"][-1]  # both ends agree
        assert raw / t["samples_trained"][-1] > 7_056 + 77  # uint8 frames were delivered: at least one a sample
        assert wire < raw / 3  # Atari frames compress well
        assert t["bytes_out"][-1] < t["bytes_out_raw"][-1]  # requests compressed (parameters stay raw)


def test_zstd_without_its_package_is_refused_before_any_rank_starts(monkeypatch, capsys, tmp_path):
    from mpirl import cli
    monkeypatch.delitem(sys.modules, "zstandard", raising=False)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if the zstd extra were not installed
    code = cli.main(["validate", str(JOBS / "cartpole.toml"), "--set", "comm.link.compression=zstd",
                     "--set", f'run.out_dir="{tmp_path}"'])  # the checks every rank of a job runs before it starts
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    assert err[0].startswith("mpirl: error: comm.link.compression: ") and "mpirl[zstd]" in err[0], err
    assert not any(tmp_path.iterdir())  # no run directory made


def test_baseline_dumps_larger_than_one_message_arrive_in_pieces(baseline):
    run_dir, s = check_common(baseline, 1)
    with h5py.File(run_dir / "run.h5", "r") as f:
        buf, train = f["buffer_1/buffer"], f["learner/train"]
        assert buf["bytes_out_raw"][-1] == train["bytes_in_raw"][-1] > 20 * 0.05 * 2**20
        assert buf["bytes_out"][-1] == train["bytes_in"][-1]


def test_samples_per_insert_holds_actors_to_the_learner(two_buffers):
    # Uneven groups (2 actors on one buffer, 1 on the other): the lone actor's buffer must
    # still fill to learning_starts / 2, or the job would wait forever.
    ratio = RATIO
    run_dir, s = check_common(two_buffers, 2)
    with h5py.File(run_dir / "run.h5", "r") as f:
        inserted = sum(int(f[b]["buffer/experiences_in"][-1]) for b in ("buffer_1", "buffer_2"))
        throttled = np.concatenate([f[b]["actors/throttled_s"][()] for b in ("buffer_1", "buffer_2")])
    # Each of 3 actors: warm-up share + one broadcast ahead + what 600 batches of 64 buy at 1/8,
    # plus at most one send batch (50) and n-step tail (3) past its budget.
    trained = 600 * 64
    warm = 2 * (250 // 2 + 53) + (250 + 53)
    bound = warm + trained / ratio + 3 * (16 * 64 / ratio / 3) + 3 * 53
    assert trained / ratio < inserted <= bound, (inserted, bound)
    assert throttled.max() > 0  # CartPole actors outrun the learner and had to wait


def test_return_window_of_the_least_exploring_actor(tmp_path):
    """run.return_from = "least_exploring": the stop window holds only the last actor rank's episodes."""
    job = run_mpi(5, tmp_path, "run.train_steps=100000", "run.target_return=1", "run.return_from=least_exploring",
                  "replay.learning_starts=300")
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["stop_reason"] == "mean return of the last 20 episodes of actor 4 reached 1"
        ep = f["buffer_1/episodes"]
        actor, ret, t = ep["actor"][()], ep["return"][()], ep["time"][()]
        windows = f["learner/train/return_mean20"][()]
    assert set(actor) == {2, 3, 4}
    order = np.argsort(t, kind="stable")
    mine = ret[order][actor[order] == 4]
    assert len(mine) >= 20
    # Every mean the learner recorded is the mean of a prefix or of 20 consecutive episodes of actor 4.
    candidates = [mine[:k].mean() for k in range(1, 20)] + [mine[i:i + 20].mean() for i in range(len(mine) - 19)]
    recorded = windows[np.isfinite(windows)]
    assert len(recorded) >= 1
    for w in recorded:
        assert np.isclose(candidates, w, rtol=1e-12, atol=0).any(), (w, mine)


def test_terminated_launch_takes_its_ranks_along(tmp_path):
    """SIGTERM to `mpirl launch` (as a batch system or `kill` sends it) stops the job cleanly and leaves no rank."""
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "mpirl", "launch", str(JOBS / "cartpole.toml"),
                             "--set", f'run.out_dir="{out}"', "--set", "run.target_return=nan",
                             "--set", "run.env_steps=0", "--set", "run.wall_seconds=300"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=mpi_env(), cwd=ROOT)
    try:
        wait_for(proc, lambda: list(out.glob("*/learner.h5")), "its learner.h5")
        wait_for(proc, lambda: len(processes_mentioning(str(out))) >= 5, "mpiexec and its 4 ranks running")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 75  # the clean stop (tests/test_launcher.py checks its checkpoint)
        left = processes_mentioning(str(out))
        assert not left, f"ranks still running after the launcher was terminated: {left}"
    finally:
        for pid in processes_mentioning(str(out)):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
