"""QMIX as one MPI job: every role exits 0 in both replay placements and with each of QMIX, MAC-PO and AccMER,
the learner's and buffers' HDF5 rows are there, and bad QMIX input is exit 2 naming the key."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from mpirl import config

from conftest import JOBS, run_cli, run_mpi

JOB = JOBS / "predator_prey_qmix.toml"
# A few train steps on small episodes: the point is the plumbing, not the learning (test_learning.py).
SHORT = ("run.train_steps=24", "run.wall_seconds=0", "env.max_episode_steps=25", "replay.batch_size=8",
         "replay.learning_starts=8", "replay.capacity=40", "qmix.test_every=10", "qmix.test_episodes=4",
         "comm.n_update=2", "log.interval=0.2")


def check_run(job, *, steps=24, buffers=1, torch_free=True):
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed", f.attrs["stop_reason"]
        assert f["job"].attrs["agent.algorithm"] == "qmix"
        assert f["provenance"].attrs["pettingzoo"]  # the PettingZoo version the run used
        assert "apex.n_step" not in f["job"].attrs  # Ape-X's settings are not QMIX's
        train, test = f["learner/train"], f["learner/test"]
        assert train["train_steps"][-1] == steps
        for col in ("loss", "td_abs", "q_tot", "grad_norm"):
            assert np.isfinite(train[col][()]).any(), col
        assert train["sample_s"][-1] > 0 and train["train_s"][-1] > 0
        assert train["samples_trained"][-1] == steps * 8
        # Rounds at train steps 10 and 20, and the final policy's at the stop.
        np.testing.assert_array_equal(test["train_steps"][()], [10, 20, steps])
        assert (test["episodes"][()] == 4).all() and np.isfinite(test["return_mean"][()]).all()
        assert np.isfinite(test["captures"][()]).all() and np.isfinite(test["lone_catches"][()]).all()
        for b in (k for k in f if k.startswith("buffer_")):
            assert f[b]["buffer"]["experiences_in"][-1] >= 1  # whole episodes
            eps = f[b]["episodes"]
            assert eps["return"].shape[0] > 0 and (eps["length"][()] <= 25).all() and (eps["length"][()] > 0).all()
            # the agent network acts in numpy (mpirl/agents/qmix_policy.py): torch never imported where the senders
            # decide (a worker on the learner's rank shares that rank's torch: ``torch_free=False``)
            assert len(f[b]["actors"]["actor"]) and f[b]["actors"]["torch_imported"][()].any() != torch_free
        assert len([k for k in f if k.startswith("buffer_")]) == buffers
    return job.run_dir


@pytest.mark.mpi
@pytest.mark.parametrize("variant, architecture", [("qmix", "proposed"), ("macpo", "baseline"),
                                                   ("accmer", "proposed"), ("accmer", "baseline")])
def test_every_role_of_a_qmix_job_exits_0(tmp_path, architecture, variant, capsys):
    """Plain QMIX with two buffers (5 ranks): the batch of episodes shared between their shards."""
    sets = {"qmix": ("topology.buffers=2",), "macpo": ("qmix.loss_weights=macpo",),
            "accmer": ("qmix.loss_weights=macpo", "qmix.sampler=accmer")}[variant]
    buffers = 2 if variant == "qmix" else 1
    job = run_mpi(3 + buffers, tmp_path, *SHORT, f"replay.architecture={architecture}", *sets, job=JOB, timeout=240)
    run_dir = check_run(job, buffers=buffers)
    with h5py.File(run_dir / "learner.h5", "r") as f:
        train = f["train"]
        if variant == "qmix":
            assert np.isnan(train["w_mean_raw"][()]).all()
        else:  # MAC-PO's raw weights and f(pi) in [1, 2] are recorded
            w, fpi = train["w_mean_raw"][()], train["f_mean"][()]
            assert np.isfinite(w).any() and (w[np.isfinite(w)] > 0).all()
            assert ((fpi[np.isfinite(fpi)] >= 1) & (fpi[np.isfinite(fpi)] <= 2)).all()
    info = run_cli("info", str(run_dir))
    assert info.returncode == 0 and "greedy test (4 episodes at train step 24)" in info.stdout, info.stdout
    if variant == "qmix":  # the learning check reads the run's own env settings and plays random games on them
        import subprocess
        import sys

        from conftest import ROOT
        check = subprocess.run([sys.executable, "analysis/marl_check.py", str(run_dir)], capture_output=True,
                               text=True, cwd=ROOT, timeout=120)
        assert check.returncode == 0, check.stderr
        row = check.stdout.splitlines()[1].split()
        assert row[0] == run_dir.name and row[1] == "24" and row[-1] in ("learned", "NOT"), check.stdout
        # The team plays greedily outside the job, recorded (one frame a step), and exports with its GRU state.
        from conftest import in_process
        from mpirl.trained.video import count_frames
        play = in_process(capsys, "play", str(run_dir), "--episodes", "2", "--video", str(tmp_path / "team.mp4"))
        assert play.returncode == 0 and "over 2 episodes" in play.stdout, play.stdout + play.stderr
        assert count_frames(tmp_path / "team.mp4") == 2 * 25  # episodes cut at the job's 25 steps
        export = in_process(capsys, "export", str(run_dir), "--out", str(tmp_path / "team.pt"))
        assert export.returncode == 0 and "(obs, avail, last_actions, h) -> (actions, h)" in export.stdout, \
            export.stdout + export.stderr


@pytest.mark.parametrize("sets, key", [
    (("apex.n_step=3",), "apex.n_step"),                            # an Ape-X setting under qmix
    (("replay.alpha=0.6",), "replay.alpha"),
    (("qmix.sampler=accmer",), "qmix.sampler"),                     # accmer without macpo
    (("qmix.accmer_alpha=1.5",), "qmix.accmer_alpha"),              # alpha outside [0, 1]
    (("replay.learning_starts=4",), "replay.learning_starts"),      # b > d when sampling starts
    (("replay.capacity=8", "replay.batch_size=16", "replay.learning_starts=16"), "replay.capacity"),
    (("agent.algorithm=r2d2",), "agent.algorithm"),                 # unknown algorithm
    (("env.id=CartPole-v1",), "env.id"),                            # not a multi-agent env
    (("env.id=pettingzoo.classic.tictactoe_v3",), "env.id"),        # not a parallel env
    (("env.id=mpe2.simple_adversary_v3",), "env.id"),               # heterogeneous agents
    (("qmix.epsilon_finish=1.5",), "qmix.epsilon_finish"),
    (("topology.workers=3",), "world size"),                        # 5 ranks: no actor left for the workers
    (("topology.workers=3", "topology.actors=2"), "topology.actors"),  # more workers than actors
    (("topology.workers=1", "topology.worker_batch=0"), "topology.worker_batch"),
    (("topology.workers=1", "topology.worker_deadline_us=inf"), "topology.worker_deadline_us"),
    (("topology.workers=1", "topology.buffers=2", "replay.batch_size=32"), "topology.workers"),  # a buffer without one
    (("topology.workers=learner", "topology.buffers=2"), "topology.buffers"),  # AW sends to one buffer
    (("topology.workers=lerner",), "topology.workers"),             # neither a number nor 'learner'
])
def test_bad_qmix_input_is_exit_2_naming_the_key(sets, key):
    proc = run_cli("validate", str(JOB), "-n", "5", *[x for s in sets for x in ("--set", s)])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mpirl: error: {key}: "), proc.stderr


def test_qmix_settings_under_apex_are_refused():
    proc = run_cli("validate", str(JOBS / "cartpole.toml"), "--set", "qmix.td_lambda=0.5")
    assert proc.returncode == 2 and "qmix.td_lambda: [qmix] belongs to agent.algorithm = 'qmix'" in proc.stderr


def test_a_multi_agent_env_under_apex_is_refused():
    proc = run_cli("validate", str(JOBS / "cartpole.toml"), "--set", "env.id=predator_prey")
    assert proc.returncode == 2 and "env.id:" in proc.stderr and "qmix" in proc.stderr


def test_world_size_that_does_not_fit_is_exit_2():
    proc = run_cli("validate", str(JOB), "-n", "2")
    assert proc.returncode == 2 and "world size" in proc.stderr


def test_validate_describes_the_qmix_job():
    proc = run_cli("validate", str(JOB), "-n", "5")
    assert proc.returncode == 0, proc.stderr
    assert "QMIX on predator_prey: 8 agents, obs (5, 5, 3) uint8, state (10, 10, 3)" in proc.stdout


@pytest.mark.mpi
def test_a_preempted_qmix_job_resumes_with_its_replay(tmp_path):
    import signal

    from conftest import finish, start_mpi, wait_for_train_steps
    from mpirl.job import checkpoint

    out = tmp_path / "runs"
    # A budget the first run never reaches: it ends by the signal, however fast this machine trains.
    sets = (*[s for s in SHORT if not s.startswith("run.train_steps")], "run.train_steps=100000",
            "checkpoint.replay=true", "checkpoint.every_steps=10")
    with start_mpi(4, out, *sets, job=JOB) as job:
        wait_for_train_steps(job, out, 30)
        job.proc.send_signal(signal.SIGUSR1)  # mpiexec forwards it to every rank: a clean stop
        code, text = finish(job, 180)
    assert code == 75, text
    run_dir = next(out.glob("*/run.h5")).parent
    stopped_at = checkpoint.load(checkpoint.checkpoints(run_dir)[-1])["train_steps"]
    assert 30 <= stopped_at < 100000  # stopped by the signal, not the budget
    with h5py.File(run_dir / "buffer_1.h5", "r") as f:
        fill_at_stop = int(f["buffer/fill"][-1])
    job = run_mpi(4, out, *[s for s in sets if not s.startswith("run.train_steps")],
                  f"run.train_steps={stopped_at + 20}", job=JOB, args=("--resume", str(run_dir)), timeout=240)
    assert job.proc.returncode == 0, job.output
    assert f"buffer rank 1: replay restored, {fill_at_stop} records" in job.output
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["restarts"] == 1
        tested = f["learner/test/train_steps"][()]
        assert np.all(np.diff(tested) > 0) and tested[-1] == stopped_at + 20  # no round twice, the last at the stop
        assert np.all(np.diff(f["learner/train/train_steps"][()]) >= 0)
    state = checkpoint.load(checkpoint.checkpoints(run_dir)[-1])
    assert state["train_steps"] == stopped_at + 20 and "agent" in state


def test_a_missing_marl_extra_is_named(monkeypatch, capsys):
    import sys

    from mpirl import cli
    for mod in [m for m in sys.modules if m == "pettingzoo" or m.startswith(("pettingzoo.", "mpirl.envs.predator_prey"))]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "pettingzoo", None)  # as if PettingZoo were not installed
    assert cli.main(["validate", str(JOB), "-n", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mpirl: error: env.id: ") and "pip install 'mpirl[marl]'" in err[0], err


@pytest.mark.mpi
def test_marl_study_runs_reads_and_reuses_only_matching_runs(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    def study(*args):
        sets = [x for s in SHORT if not s.startswith(("run.train_steps", "run.wall_seconds")) for x in ("--set", s)]
        return subprocess.run([sys.executable, "analysis/marl_study.py", "--out", str(tmp_path), "--agents", "8",
                               "--variants", "accmer", "--seeds", "1", "-n", "4", *sets, *args],
                              capture_output=True, text=True, cwd=ROOT, timeout=300)

    first = study("--steps", "12")
    assert first.returncode == 0, first.stdout + first.stderr
    row = (tmp_path / "table.txt").read_text().splitlines()[1].split()
    assert row[:3] == ["8", "accmer", "1"] and float(row[3]) > 0  # seconds per train step, measured
    assert "pp8-accmer-s1: running" in first.stdout
    again = study("--steps", "12")
    assert again.returncode == 0 and "done earlier" in again.stdout, again.stdout
    # A run of another length is not the same run: --read finds none and prints only the header.
    other = study("--steps", "13", "--read")
    assert other.returncode == 0 and len((tmp_path / "table.txt").read_text().splitlines()) == 1, other.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("n, workers, architecture", [(6, 2, "baseline")])  # proposed: the kill test below
def test_inference_workers_serve_the_actors_and_record_what_they_served(tmp_path, n, workers, architecture):
    """DMCAF's actor-worker-learner: actors only step games, workers answer them in batches and ship the episodes."""
    # worker_batch 1: a pass answers one request at most, the oldest first (the others wait for the next).
    job = run_mpi(n, tmp_path, *SHORT, f"topology.workers={workers}", f"replay.architecture={architecture}",
                  "topology.worker_batch=1", job=JOB, timeout=240)
    run_dir = check_run(job)
    first_worker, first_actor = 2, 2 + workers
    actors = list(range(first_actor, n))
    served = {}
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert sorted(k for k in f if k.startswith("worker_")) == [f"worker_{w}" for w in range(2, 2 + workers)]
        # The buffer hears from the workers, not from the actors.
        assert set(f["buffer_1/actors"]["actor"][()]) == set(range(first_worker, first_actor))
        assert sorted(f["buffer_1"].attrs["actors"]) == list(range(first_worker, first_actor))
        for w in range(first_worker, first_actor):
            wk, act = f[f"worker_{w}/worker"], f[f"worker_{w}/actors"]
            mine = list(f[f"worker_{w}"].attrs["actors"])
            served[w] = mine
            assert wk["steps_served"][-1] > 0 and wk["passes"][-1] > 0
            assert wk["steps_served"][-1] == 4 * wk["requests"][-1]  # a request steps the actor's 4 games
            assert wk["batch_max"][()].max() == 1 and wk["passes"][-1] == wk["requests"][-1]
            assert np.isfinite(wk["latency_p50_ms"][()]).any() and wk["param_version"][-1] >= 1
            assert set(act["actor"][()]) == set(mine)
            last = {int(a): (int(s), float(wt)) for a, s, wt in zip(act["actor"][()], act["env_steps"][()],
                                                                   act["wait_s"][()])}
            assert all(s > 0 and wt > 0 for s, wt in last.values()), last
    assert sorted(sum(served.values(), [])) == actors
    info = run_cli("info", str(run_dir))
    assert info.returncode == 0 and f"1 buffer(s), {workers} worker(s), {n - 2 - workers} actors" in info.stdout
    assert all(f"worker_{w}      steps served" in info.stdout for w in served), info.stdout


@pytest.mark.mpi
def test_the_worker_on_the_learners_rank_serves_the_actors_between_train_steps(tmp_path):
    """DMCAF's actor-worker (AW): no worker rank; the learner answers the actors and ships their episodes."""
    job = run_mpi(4, tmp_path, *SHORT, "topology.workers=learner", job=JOB, timeout=240)
    assert "ranks: 0 learner and worker; 1 buffer; 2-3 actors of worker 0" in job.output, job.output
    run_dir = check_run(job, torch_free=False)
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert sorted(k for k in f if k.startswith("worker_")) == ["worker_0"]
        assert set(f["buffer_1/actors"]["actor"][()]) == {0}  # the buffer hears from the learner's worker
        wk, act = f["worker_0/worker"], f["worker_0/actors"]
        assert list(f["worker_0"].attrs["actors"]) == [2, 3]
        assert wk["steps_served"][-1] == 4 * wk["requests"][-1] > 0
        # It served while the learner trained: versions after the first, and episodes trained on.
        assert wk["param_version"][-1] > 1 and f["learner/train/samples_trained"][-1] == 24 * 8
        assert np.isfinite(wk["latency_p50_ms"][()]).any() and wk["infer_s"][-1] > 0
        # Its actors' rows (an actor that started late on a loaded machine, after the 24 train steps its partner's
        # episodes paid for, has none: seen once in a whole suite's run).
        assert len(act["actor"]) and set(act["actor"][()]) <= {2, 3} and (act["env_steps"][()] >= 0).all()
    info = run_cli("info", str(run_dir))
    assert info.returncode == 0 and "1 learner (the actors' worker), 1 buffer(s), 2 actors" in info.stdout, info.stdout
    assert "worker_0      steps served" in info.stdout, info.stdout


@pytest.mark.mpi
def test_a_killed_worker_ends_the_job_and_resume_continues(tmp_path):
    import os
    import signal

    from conftest import finish, ranks_of, start_mpi, wait_for_train_steps

    from mpirl.job import checkpoint

    out = tmp_path / "runs"
    sets = (*SHORT[1:], "checkpoint.every_steps=20", "log.flush_seconds=0.2", "topology.workers=1")
    # The first run's budget is never reached: it ends when its worker is killed, however fast this machine is.
    with start_mpi(5, out, "run.train_steps=100000", *sets, job=JOB) as job:
        wait_for_train_steps(job, out, 30)
        os.kill(ranks_of(job.pid)[2], signal.SIGKILL)  # the worker
        code, text = finish(job, 180)  # the job ends: never a hang
    assert code != 0, code
    assert "ranks: 0 learner; 1 buffer, 2 worker of buffer 1; 3-4 actors of worker 2" in text, text[-3000:]
    assert "rank 2" in text and "signal 9" in text, text[-3000:]
    run_dir = next(out.glob("*/run.h5")).parent
    steps = int(checkpoint.checkpoints(run_dir)[-1].name[5:15]) + 40  # 60 after a kill before step 40
    job = run_mpi(5, out, f"run.train_steps={steps}", *sets, job=JOB, args=("--resume", str(run_dir)), timeout=240)
    assert job.proc.returncode == 0, job.output
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed" and f["learner/train/train_steps"][-1] == steps
        wk = f["worker_2/worker"]
        # Rows after the checkpoint were dropped; the counters continue from the last kept row.
        assert np.all(np.diff(wk["time"][()]) >= 0) and np.all(np.diff(wk["steps_served"][()]) >= 0)
        assert np.all(np.diff(wk["passes"][()]) >= 0) and wk["steps_served"][-1] > 0


@pytest.mark.parametrize("sets, start", [
    (("env.predator_prey.grid=3",), "env.predator_prey.grid: 8 predators and 8 prey need 16 cells and a 3x3 grid"),
    (("env.predator_prey.predators=60",), "env.predator_prey.predators: 60 predators and 60 prey need 120 cells"),
    (("env.predator_prey.grid=5", "env.predator_prey.prey=24"), "env.predator_prey.prey: 8 predators and 24 prey"),
    (("env.id=pettingzoo.atari.pong_v3",), "env.id: pettingzoo.atari.pong_v3 needs the Python package "
                                           "'multi_agent_ale_py', which is not installed: pip install 'pettingzoo[atari]'"),
])
def test_a_refusal_leads_with_the_field_to_change_and_a_fix_that_fixes(sets, start):
    if "pong" in sets[0]:
        import importlib.util
        if importlib.util.find_spec("multi_agent_ale_py"):
            pytest.skip("multi_agent_ale_py is installed here")
    proc = run_cli("validate", str(JOB), "-n", "5", *[x for s in sets for x in ("--set", s)])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"mpirl: error: {start}"), proc.stderr
    assert "mpirl[marl]" not in proc.stderr


@pytest.mark.parametrize("env_id, steps", [("mpe2.simple_v3", 25), ("mpe2.simple_reference_v3", 25),
                                           ("pettingzoo.sisl.pursuit_v5", 500), ("predator_prey", 200)])
def test_max_episode_steps_0_keeps_the_envs_own_limit(env_id, steps):
    proc = run_cli("validate", str(JOB), "-n", "5", "--set", f"env.id={env_id}")
    assert proc.returncode == 0 and f"episodes of up to {steps} steps" in proc.stdout, proc.stdout + proc.stderr


def test_a_set_limit_reaches_the_env_that_keeps_one():
    from mpirl.algos.qmix.algorithm import spaces_of
    from mpirl.algos.qmix.envs import make
    from mpirl.envs.pettingzoo import own_episode_limit
    cfg, _ = config.load(JOB, ["env.id=mpe2.simple_spread_v3", "env.max_episode_steps=40"])
    spaces = spaces_of(cfg)
    game = make(cfg, 0, spaces)
    try:
        assert spaces.episode_limit == 40 and own_episode_limit(game) == ("max_cycles", 40)
        game.reset()
        steps = 0
        while not (out := game.step(np.zeros(game.n_agents, np.int64))).truncated:
            steps += 1
        assert steps + 1 == 40 and not out.terminated
    finally:
        game.close()


def test_an_env_that_keeps_no_limit_needs_max_episode_steps(monkeypatch, capsys):
    """An env id by import path whose env keeps no max_cycles: 0 cannot keep a limit it does not have."""
    import sys

    import endless_team_env

    from mpirl import cli
    monkeypatch.setitem(sys.modules, "mpe2.endless_v0", endless_team_env)
    assert cli.main(["validate", str(JOB), "-n", "5", "--set", "env.id=mpe2.endless_v0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mpirl: error: env.max_episode_steps: 0 keeps the environment's "
                                               "own limit, and 'mpe2.endless_v0' keeps none"), err
    assert cli.main(["validate", str(JOB), "-n", "5", "--set", "env.id=mpe2.endless_v0",
                     "--set", "env.max_episode_steps=30"]) == 0
    assert "episodes of up to 30 steps" in capsys.readouterr().out
