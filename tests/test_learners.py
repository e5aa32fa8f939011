"""K data-parallel learners for Ape-X and QMIX (``topology.learners``, Gorila's several learners): each learner's part
of the batch, the communicators, the equality with one learner on the same samples, a part that is not finite named
by every learner, jobs that learn with two, checkpoint and resume, and the refusals."""

from __future__ import annotations

import json
import os
import signal

import h5py
import numpy as np
import pytest

from mpirl import config
from mpirl.comm.topology import Layout, Link, plan
from mpirl.replay.quotas import even_quotas, learner_quotas
from mpirl.job import checkpoint

from conftest import (JOBS, ROOT, finish, ranks_of, run_cli, run_mpi, run_mpi_script, start_mpi,
                      wait_for_train_steps)

JOB = JOBS / "cartpole.toml"


# ---------------------------------------------------------------- parts of a batch
@pytest.mark.parametrize("quotas,K", [([64], 2), ([7], 2), ([32, 32], 2), ([22, 21, 21], 4), ([2, 1, 1], 4),
                                      ([3, 3], 5), ([64], 64)])
def test_the_learners_parts_cut_the_batch_one_learner_would_draw(quotas, K):
    parts = learner_quotas(quotas, K)
    n = sum(quotas)
    assert len(parts) == K and all(len(p) == len(quotas) for p in parts)
    assert [sum(p) for p in parts] == even_quotas(n, K)  # even parts, the first n % K one row more
    assert np.sum(parts, axis=0).tolist() == quotas  # together each shard's whole share
    rows = [b for p in parts for b, q in enumerate(p) for _ in range(q)]  # shard of each row, learner by learner
    assert rows == [b for b, q in enumerate(quotas) for _ in range(q)]  # consecutive cuts of the one batch


def test_more_learners_than_rows_is_an_error():
    with pytest.raises(ValueError, match="3 learners"):
        learner_quotas([1, 1], 3)


def test_the_learners_talk_to_every_buffer_and_the_first_publishes():
    lay = Layout({"learner": (0, 1), "buffer": (2, 3), "actor": (4, 5, 6, 7)},
                 (Link("experience", "actor", "buffer"), Link("requests", "learner", "buffer", hub="source", span="all"),
                  Link("parameters", "learner", "buffer", hub="source", span="first"),
                  Link("gradients", "learner", "learner")))
    groups = plan(lay, ["a"] * 8)
    req, params, grads = (groups[link] for link in lay.links[1:])
    assert req == {0: 0, 1: 0, 2: 0, 3: 0}  # one group, learner 0 its rank 0, then learner 1, then the buffers
    assert params == {0: 0, 2: 0, 3: 0}  # the first learner and the buffers
    assert grads == {0: 0, 1: 0}
    assert set(groups[lay.links[0]].values()) == {2, 3}  # the actors still spread over the buffers


# ---------------------------------------------------------------- K learners = one learner
# float32 after 40 steps: K learners and one part by up to ~1e-4 on some CPUs (9.2e-5 on this Intel Xeon's AVX-512
# kernels and under MKL_CBWR=COMPATIBLE, 3e-8 under MKL_CBWR=AVX2) where a ReLU's input within rounding of 0 takes
# opposite signs in the part's and the whole batch's matrix products (tests/learners_job.py); float64 leaves no such
# input, and there they agree to rounding, which is where a real difference between K learners and one would show.
F32_APART, F64_APART = 1e-3, 1e-10


@pytest.mark.mpi
@pytest.mark.numerical
@pytest.mark.parametrize("K,cases", [(2, ("dqn:7", "qmix:9")), (3, ("dqn:64", "macpo:10"))],
                         ids=["2 learners", "3 learners"])
def test_k_learners_take_the_step_one_learner_takes_on_the_whole_batch(tmp_path, K, cases):
    """Same batches, K learners each on its part with the gradient sum, and one learner alone on each whole batch:
    after 40 steps every learner's parameters are bit-identical, and in float64 they agree with the one learner's
    to rounding, as do the parts' new values (Ape-X: |TD| of prioritized, importance-weighted transitions; QMIX:
    each episode's weight, with MAC-PO's weights normalised over the whole batch and its central mixer's
    optimizer) with the whole batch's. In float32 they agree to what a ReLU's kink leaves (see F32_APART). (Each
    mpiexec runs two cases: its start-up once.)"""
    out = tmp_path / "k.json"
    code, text = run_mpi_script(K, ROOT / "tests" / "learners_job.py", str(out), "40", *cases, timeout=300)
    assert code == 0, text
    got = json.loads(out.read_text())
    for case in cases:
        n = int(case.split(":")[1])
        cuts = [[int(a), int(b)] for a, b in zip(np.cumsum([0] + even_quotas(n, K))[:-1], np.cumsum(even_quotas(n, K)))]
        for dtype, apart in (("float32", F32_APART), ("float64", F64_APART)):
            res = got[case][dtype]
            assert [r["rows"] for r in res] == cuts, (case, dtype)
            assert len({r["crc"] for r in res}) == 1 and all(r["steps"] == 40 for r in res), (case, dtype, res)
            head = res[0]
            assert head["ref_steps"] == 40 and head["moved"] > 1e-3, (case, dtype, head)  # the reference learned
            assert head["param_diff"] <= apart * max(1.0, head["param_scale"]), (case, dtype, head)
            assert head["td_diff"] <= apart, (case, dtype, head)


@pytest.mark.mpi
def test_a_part_that_is_not_finite_is_named_by_every_learner(tmp_path):
    """The last of 3 learners gets a NaN reward in its part of step 1 (of 3), for Ape-X, QMIX and MAC-PO: every
    learner skips that step alone (the sum is not finite everywhere), the last says what in its part was not finite,
    the others name its part rather than blaming their own finite rows."""
    out = tmp_path / "out.json"
    cases = ("dqn-nan:9", "qmix-nan:9", "macpo-nan:9")
    code, text = run_mpi_script(3, ROOT / "tests" / "learners_job.py", str(out), "3", *cases, timeout=300)
    assert code == 0, text
    got = json.loads(out.read_text())
    for case in cases:
        res = got[case]
        assert [r["skipped"] for r in res] == [[False, True, False]] * 3, (case, res)
        assert all(r["steps"] == 2 for r in res), (case, res)
        *others, last = res
        assert last["fault"][0] in ("batch", "targets"), (case, last)  # QMIX's reward enters its targets
        assert "not finite" in last["fault"][1] and "learner 2's part" not in last["fault"][1], (case, last)
        for r in others:
            assert r["fault"] == ["peer", "learner 2's part of the batch was not finite (this learner's part was; "
                                          "that learner's message names what)"], (case, r)


# ---------------------------------------------------------------- a job with two learners
def _files(run_dir):
    out = {}
    with h5py.File(run_dir / "run.h5", "r") as f:
        out["attrs"] = dict(f.attrs)
        for name in ("learner", "learner_1"):
            g = f[name]
            out[name] = {"attrs": dict(g.attrs), "train": {k: g["train"][k][()] for k in g["train"]},
                         "shards": {k: g["shards"][k][()] for k in g["shards"]}}
        out["buffer"] = {k: f["buffer_2/buffer"][k][()] for k in f["buffer_2/buffer"]}
    return out


def _two_learners_agree(r: dict, steps: int, resumed: bool = False) -> None:
    first, second = r["learner"], r["learner_1"]
    assert first["attrs"]["train_steps"] == second["attrs"]["train_steps"] == steps
    assert first["attrs"]["params_crc32"] == second["attrs"]["params_crc32"]  # identical parameters at the end
    assert (first["attrs"]["learner"], second["attrs"]["learner"]) == (0, 1)
    # Each drew its 32 of every batch of 64 from the one buffer, and brought all its priorities back.
    for g in (first, second):
        assert g["shards"]["quota"][-1] == 32 and g["shards"]["consumed"][-1] == 32 * steps
    b = r["buffer"]
    assert b["consumed"][-1] == 64 * steps  # the sum of both learners' counts
    if not resumed:  # (a resumed buffer's count continues from its last row before the checkpoint)
        assert b["priority_updates"][-1] == 64 * steps
    assert first["train"]["episodes"][-1] > 0 and second["train"]["episodes"][-1] == 0  # returns: the first's


@pytest.mark.learning
@pytest.mark.mpi
def test_apex_with_two_learners_learns_cartpole(tmp_path):
    """The default job with topology.learners = 2 (2 learners, 1 buffer, 2 actors) learns: its stop's window
    reaches 100, 4-5 times random play's (this machine, idle: 8-9 s for seeds 1-3; to 195, 12-33 s), and the
    buffer's own table rises from random play to a best 20 episodes in a row of 80 or more."""
    job = run_mpi(5, tmp_path, "topology.learners=2", "run.target_return=100", timeout=900, stall=300)
    assert job.proc.returncode == 0, job.output
    r = _files(job.run_dir)
    assert r["attrs"]["status"] == "completed" and "reached 100" in r["attrs"]["stop_reason"], r["attrs"]
    steps = int(r["learner"]["attrs"]["train_steps"])
    _two_learners_agree(r, steps)
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        ret = f["buffer_2/episodes/return"][()]
    best = np.convolve(ret, np.ones(20) / 20, mode="valid").max()
    assert ret[:20].mean() < 60 and best >= 80, (ret[:20].mean(), best, ret[-20:].mean())


@pytest.mark.mpi
def test_two_learners_on_the_baseline_each_keep_a_copy_of_the_dumps(tmp_path):
    """replay.architecture = "baseline": each learner asks every buffer for its dump, keeps a copy, draws its 32
    of every batch from it; identical parameters at the end."""
    job = run_mpi(5, tmp_path, "topology.learners=2", "replay.architecture=baseline", "run.train_steps=300",
                  "run.env_steps=0", "run.target_return=nan", "run.wall_seconds=0", "replay.learning_starts=500",
                  timeout=300)
    assert job.proc.returncode == 0, job.output
    r = _files(job.run_dir)
    assert r["attrs"]["status"] == "completed", r["attrs"]
    first, second = r["learner"], r["learner_1"]
    assert first["attrs"]["train_steps"] == second["attrs"]["train_steps"] == 300
    assert first["attrs"]["params_crc32"] == second["attrs"]["params_crc32"]
    for g in (first, second):  # each drew 32 a batch from its copy, and its copy came in dumps
        assert g["shards"]["consumed"][-1] == 32 * 300 and g["attrs"]["bytes_in"] > 0
    assert r["buffer"]["consumed"][-1] == 64 * 300


LONG = ("topology.learners=2", "run.env_steps=0", "run.target_return=nan", "run.wall_seconds=0",
        "replay.learning_starts=200", "checkpoint.every_steps=100", "log.interval=0.2")


@pytest.mark.mpi
def test_a_killed_learner_ends_the_job_and_resume_continues_from_the_last_checkpoint(tmp_path):
    """kill -9 of the second learner (the first waits for it in the next sum): the job ends, not hangs; the
    periodic checkpoint (every 100 steps) holds each learner's samples per shard, and --resume continues from it to
    the end. (A signal's stop is the first learner's, as with one learner: tests/test_checkpoint.py.)"""
    out = tmp_path / "runs"
    with start_mpi(5, out, *LONG, "run.train_steps=100000") as job:
        wait_for_train_steps(job, out, 150)
        os.kill(ranks_of(job.pid)[1], signal.SIGKILL)
        code, text = finish(job, 180)
    assert code != 0, text
    run_dir = next(out.glob("*/run.h5")).parent
    st = checkpoint.load(checkpoint.checkpoints(run_dir)[-1])
    saved = int(st["train_steps"])
    assert saved >= 100 and saved % 100 == 0
    assert st["learners_consumed"] == [[32 * saved], [32 * saved]]  # each learner's half of every batch
    job = run_mpi(5, out, *LONG, f"run.train_steps={saved + 50}", args=("--resume", str(run_dir)))
    assert job.proc.returncode == 0, job.output
    _two_learners_agree(_files(run_dir), saved + 50, resumed=True)


def test_validate_counts_each_learner_s_memory():
    proc = run_cli("validate", str(JOB), "-n", "6", "--set", "topology.learners=2")
    assert proc.returncode == 0, proc.stderr
    assert "on 6 ranks: 2 learners, 1 buffer(s), 3 actor(s)" in proc.stdout, proc.stdout
    assert "2 learner(s)" in proc.stdout and "GiB each" in proc.stdout, proc.stdout


# ---------------------------------------------------------------- refusals
def _refusal(n: int, *sets: str, job=JOB) -> config.ConfigError:
    from mpirl.registry import algorithm
    with pytest.raises(config.ConfigError) as err:
        cfg, _ = config.load(job, list(sets))
        algorithm(cfg.agent.algorithm).check(cfg, n, str(job))
    return err.value


@pytest.mark.parametrize("n,sets,key", [
    (5, ["topology.learners=0"], "topology.learners"),
    (5, ["topology.learners=2", "replay.batch_size=1", "topology.actors=2"], "topology.learners"),
    (70, ["topology.learners=65"], "topology.learners"),  # more learners than rows of a batch of 64
    (5, ["topology.learners=2", 'replay.shares="rate"'], "replay.shares"),
    (5, ["topology.learners=2", "replay.frame_cache=1000"], "replay.frame_cache"),
    (4, ["topology.learners=2", 'topology.workers="learner"'], "topology.workers"),
    (3, ["topology.learners=2"], "world size"),  # 2 learners + 1 buffer + 1 actor at least
    (5, ["topology.learners=1.5"], "topology.learners"),
])
def test_bad_learner_input_is_refused_naming_the_key(n, sets, key):
    err = _refusal(n, *sets)
    assert key in f"{err.key}: {err.message}", (err.key, err.message)


def test_accmer_refuses_several_learners():
    err = _refusal(5, "topology.learners=2", "qmix.loss_weights=macpo", "qmix.sampler=accmer",
                   job=JOBS / "predator_prey_qmix.toml")
    assert err.key == "qmix.sampler", (err.key, err.message)


def test_algorithms_without_data_parallel_learners_refuse_them():
    err = _refusal(5, "topology.learners=2", job=JOBS / "impala_cartpole.toml")
    assert err.key == "topology.learners", (err.key, err.message)  # IMPALA does not read the key


QMIX_SHORT = ("run.train_steps=12", "run.wall_seconds=0", "env.max_episode_steps=25", "replay.batch_size=8",
              "replay.learning_starts=8", "replay.capacity=40", "qmix.test_every=5", "qmix.test_episodes=4",
              "comm.n_update=2", "log.interval=0.2")


@pytest.mark.mpi
# The baseline (each learner's copy of the episodes); the proposed placement's parts are Ape-X's path (tested above)
# and QMIX's sums are tested against one learner in test_k_learners_take_the_step_one_learner_takes_...
@pytest.mark.parametrize("architecture", ["baseline"])
def test_two_qmix_learners_train_one_batch_of_episodes_and_send_their_weights_back(tmp_path, architecture):
    """MAC-PO on predator-prey with 2 learners (2 learners, 1 buffer, 2 actors): both make the 12 train steps
    with identical parameters, each drew 4 of the 8 episodes of every batch and sent their weights back; the
    first learner alone plays the test rounds."""
    job = run_mpi(5, tmp_path, *QMIX_SHORT, "topology.learners=2", "qmix.loss_weights=macpo",
                  f"replay.architecture={architecture}", job=JOBS / "predator_prey_qmix.toml", timeout=300)
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed", f.attrs["stop_reason"]
        first, second = f["learner"], f["learner_1"]
        assert first.attrs["train_steps"] == second.attrs["train_steps"] == 12
        assert first.attrs["params_crc32"] == second.attrs["params_crc32"]
        for g in (first, second):
            assert g["shards/quota"][-1] == 4 and g["shards/consumed"][-1] == 4 * 12
            assert np.isfinite(g["train/w_mean_raw"][()]).any()
        np.testing.assert_array_equal(first["test/train_steps"][()], [5, 10, 12])
        assert second["test/train_steps"].shape == (0,)
        b = f["buffer_2/buffer"]
        assert b["consumed"][-1] == 8 * 12
        if architecture == "proposed":  # (the baseline's weights stay in each learner's copy)
            assert b["priority_updates"][-1] == 8 * 12


def test_bad_learner_input_is_exit_2_from_the_command_line():
    proc = run_cli("validate", str(JOB), "-n", "5", "--set", "topology.learners=2", "--set", 'replay.shares="rate"')
    assert proc.returncode == 2 and "replay.shares" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
