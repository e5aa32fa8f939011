"""Refusals before any rank starts: memory that a node cannot hold, a run directory that cannot be made,
a resume of nothing; the same exit 2 and the same line through validate, launch and mpiexec."""

from __future__ import annotations

import pytest

from mpirl import config
from mpirl.job import memory
from mpirl.algos.apex import memory as apex_memory

from conftest import JOBS, in_process, run_cli, run_mpi

CARTPOLE = str(JOBS / "cartpole.toml")


def error_lines(proc) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("mpirl: error:")]


def refusal(capsys, command: str, *args: str):
    """``mpirl COMMAND ARGS``: validate in this process (its checks are all it does), launch as a user runs it (its
    job's rank 0 checks itself and hands the refusal to the launcher, which prints it)."""
    return in_process(capsys, command, *args) if command == "validate" else run_cli(command, *args)


def cartpole_slot() -> float:
    cfg, _ = config.load(JOBS / "cartpole.toml")
    return apex_memory.estimate(cfg, 4, (4,), "float32", 2).slot_bytes


def test_the_estimate_is_near_the_peaks_measured_on_the_default_job():
    cfg, _ = config.load(JOBS / "cartpole.toml")
    est = apex_memory.estimate(cfg, 4, (4,), "float32", 2)
    # Measured peaks (run.h5 peak_rss_bytes, default job): learner 398 MB, buffer 360 MB, actors 318 MB.
    for got, measured in ((est.of("learner"), 398), (est.of("buffer"), 360), (est.of("actor"), 318)):  # RSS counts shared pages
        assert 0.8 * measured <= (got + memory.LIBRARIES) / 2**20 <= 1.3 * measured
    cfg.replay.capacity *= 10
    bigger = apex_memory.estimate(cfg, 4, (4,), "float32", 2)
    assert bigger.of("buffer") - est.of("buffer") == pytest.approx(9 * 50_000 * est.slot_bytes, rel=0.01)


@pytest.mark.parametrize("shape, hidden", [((4,), [64, 64]), ((4, 84, 84), [512]), ((10, 10, 4), [128])],
                         ids=["mlp", "nature", "minatar"])
def test_a_small_network_counted_for_real_counts_as_on_the_meta_device(shape, hidden):
    """Every rank counts the job's network; a small one by a real forward pass (cheap), a big one on the meta
    device (nothing allocated): both give the same bytes."""
    import torch
    before = torch.random.get_rng_state()
    real = apex_memory._network_bytes(shape, 4, hidden, "auto", 32)
    assert torch.equal(torch.random.get_rng_state(), before)  # building it drew nothing from the rank's stream
    assert real == apex_memory._network_bytes(shape, 4, hidden, "auto", 32, real_up_to=0)
    assert real[0] <= apex_memory.REAL_FORWARD_BYTES


def test_a_frame_cache_no_learner_can_hold_is_refused_naming_replay_frame_cache():
    """Two buffers' caches on the learner (2 x 8 frames a slot) outgrow the node while each buffer's frame pool
    (8 frames a slot) is still a reservation the kernel grants: the fix named is the cache's, not the capacity's."""
    avail = memory.available_bytes()
    capacity = int(0.6 * avail / (8 * 84 * 84))
    proc = run_cli("validate", str(JOBS / "breakout_proposed_small.toml"), "-n", "5", "--set", "topology.buffers=2",
                   "--set", f"replay.capacity={capacity}", "--set", f"replay.frame_cache={8 * capacity}")
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith("mpirl: error: replay.frame_cache: the job needs about "), lines[0]
    assert "lower replay.frame_cache" in lines[0] and "Traceback" not in proc.stderr


def test_a_replay_no_node_can_hold_is_refused_by_validate():
    avail = memory.available_bytes()
    capacity = min(int(1.5 * avail / cartpole_slot()), 2**31 - 1)
    proc = run_cli("validate", CARTPOLE, "--set", f"replay.capacity={capacity}")
    assert proc.returncode == 2, proc.stdout
    lines = error_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("mpirl: error: replay.capacity: the job needs about ")
    assert "lower replay.capacity" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.mpi
def test_ranks_that_fit_alone_but_not_together_are_refused_by_launch_and_inside_the_job(tmp_path):
    avail = memory.available_bytes()
    capacity = int(0.6 * avail / cartpole_slot())  # each of two buffers fits, both do not
    sets = ("--set", "topology.buffers=2", "--set", f"replay.capacity={capacity}",
            "--set", f'run.out_dir="{tmp_path}"')
    assert run_cli("validate", CARTPOLE, *sets).returncode == 0
    launch = run_cli("launch", CARTPOLE, *sets)
    assert launch.returncode == 2 and len(error_lines(launch)) == 1, launch.stdout + launch.stderr
    assert " on node " in error_lines(launch)[0]  # the node's ranks together, checked inside the job
    job = run_mpi(5, tmp_path, "topology.buffers=2", f"replay.capacity={capacity}", timeout=180)
    assert job.proc.returncode == 2, job.output
    lines = error_lines(job.proc)
    assert len(lines) == 1 and lines[0].startswith("mpirl: error: replay.capacity: the job needs about ")
    assert job.run_dirs == [] and not any(tmp_path.iterdir())  # nothing that looks like a run


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["out_dir under a file", "resume of a directory without a run"])
def test_the_same_refusal_through_every_launch_path(tmp_path, case):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    (tmp_path / "norun").mkdir()
    if case.startswith("out_dir"):
        sets, args, start = (f'run.out_dir="{blocker / "runs"}"',), (), "mpirl: error: run.out_dir: cannot make "
    else:
        sets, args, start = (), ("--resume", str(tmp_path / "norun")), "mpirl: error: --resume: "
    flags = [x for s in sets for x in ("--set", s)]
    validate = run_cli("validate", CARTPOLE, "--set", f'run.out_dir="{tmp_path}"', *flags, *args)
    launch = run_cli("launch", CARTPOLE, "--set", f'run.out_dir="{tmp_path}"', *flags, *args)
    job = run_mpi(4, tmp_path, *sets, args=args, timeout=180)  # plain mpiexec: the check runs inside the job
    procs = (validate, launch, job.proc)
    lines = [error_lines(p) for p in procs]
    assert [p.returncode for p in procs] == [2, 2, 2], lines
    assert all(len(x) == 1 and x[0].startswith(start) for x in lines), lines
    assert lines[0] == lines[1] == lines[2], lines
    assert "Traceback" not in job.output and "TypeError" not in job.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "norun"]  # no run directory anywhere


@pytest.mark.mpi  # launch leaves these checks to the job (rank 0, mpirl/job/launched.py)
@pytest.mark.parametrize("args, start", [
    (("-n", "2"), "mpirl: error: world size: the job needs 1 learner + 1 buffer(s)"),
    (("--set", "agent.device=cuda"), "mpirl: error: agent.device: 'cuda' but the learner's node"),
])
def test_launch_refuses_before_any_rank_starts_work_so_one_line_is_all(tmp_path, args, start):
    if "agent.device=cuda" in args:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    proc = run_cli("launch", CARTPOLE, "--set", f'run.out_dir="{tmp_path}"', *args)
    assert proc.returncode == 2
    assert (proc.stdout + proc.stderr).strip().splitlines() == error_lines(proc) and error_lines(proc)[0].startswith(start)
    assert not any(tmp_path.iterdir())


PREDATOR_PREY = str(JOBS / "predator_prey_qmix.toml")


@pytest.mark.mpi  # launch: the job checks itself (rank 0)
@pytest.mark.parametrize("job, n, sets, key", [
    (CARTPOLE, 4, ("agent.hidden=[200000, 200000]",), "agent.hidden"),
    (PREDATOR_PREY, 5, ("qmix.rnn_hidden=65536",), "qmix.rnn_hidden"),
    (PREDATOR_PREY, 5, ("qmix.hypernet_hidden=65536", "qmix.mixer_embed=65536"), "qmix.mixer_embed"),
    (PREDATOR_PREY, 5, ("qmix.loss_weights=macpo", "qmix.central_hidden=65536"), "qmix.central_hidden"),
])
def test_a_network_no_node_can_hold_is_refused_by_its_size_not_by_building_it(tmp_path, job, n, sets, key, capsys):
    """The estimate counts parameters without allocating them (torch's meta device): a network of many GB is
    refused in a moment with the estimate and the setting that makes it big, through validate and (the first case:
    the path is the same for all, rank 0's checks of the job) launch."""
    flags = [x for s in sets for x in ("--set", s)]
    for command in ("validate", "launch") if key == "agent.hidden" else ("validate",):
        proc = refusal(capsys, command, job, "-n", str(n), "--set", f'run.out_dir="{tmp_path}"', *flags)
        lines = error_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
        assert lines[0].startswith(f"mpirl: error: {key}: the job needs about "), lines[0]
        assert "use a smaller network" in lines[0] and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())


MINATAR = str(JOBS / "minatar_breakout.toml")


@pytest.mark.mpi  # launch: the job checks itself (rank 0)
@pytest.mark.parametrize("sets, start", [
    (("agent.network=nature",), "mpirl: error: agent.network: 'MinAtar/Breakout-v1' observes (4, 10, 10) bool: "
                                "the nature network needs images of 36x36 or more"),
    (("agent.network=nature", "env.channels=first"),  # taken as 10 channels of 10x4: as the user said
     "mpirl: error: agent.network: 'MinAtar/Breakout-v1' observes (10, 10, 4) bool: the nature network needs"),
    (("env.id=\"CartPole-v1\"", "agent.network=minatar"),
     "mpirl: error: agent.network: 'CartPole-v1' observes (4,) float32: the minatar network takes (C, H, W) images"),
])
def test_a_shape_the_network_cannot_take_is_exit_2_naming_the_shape_not_a_traceback(tmp_path, sets, start, capsys):
    flags = [x for s in sets for x in ("--set", s)]
    for command in ("validate", "launch") if sets == ("agent.network=nature",) else ("validate",):
        proc = refusal(capsys, command, MINATAR, "--set", f'run.out_dir="{tmp_path}"', *flags)
        lines = error_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
        assert lines[0].startswith(start), lines[0]
    assert not any(tmp_path.iterdir())


@pytest.mark.mpi
def test_every_exit_2_under_plain_mpiexec_is_one_line_and_open_mpis_box_as_the_readme_says(tmp_path):
    """A key refused while loading the job (not an in-job check) under plain mpiexec: the one line, then Open MPI's
    box about the non-zero exit; the README says so for every exit 2."""
    from conftest import ROOT
    job = run_mpi(2, tmp_path, "replay.capcity=3", timeout=180)
    assert job.proc.returncode == 2 and len(error_lines(job.proc)) == 1, job.output
    assert error_lines(job.proc)[0].startswith("mpirl: error: replay.capcity: unknown key")
    assert "exited with non-zero status" in " ".join(job.output.split())  # Open MPI's box
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`mpiexec` every exit 2 (the ranks run every check themselves) is followed by Open MPI's own box" in readme


IMPALA = str(JOBS / "impala_cartpole.toml")
A3C = str(JOBS / "a3c_cartpole.toml")


@pytest.mark.mpi  # launch: the job checks itself (a world too large for the node: the launcher, before it starts)
@pytest.mark.parametrize("job, sets, commands, key, fix", [
    (IMPALA, ("topology.actors=1000000",), ("validate", "launch"), "topology.actors",
     "lower topology.actors (now 1,000,000: a world of 1,000,002 ranks)"),
    (A3C, ("a3c.unroll=100000", "env.envs_per_actor=4096"), ("validate",), "a3c.unroll",
     "lower a3c.unroll (now 100,000) or env.envs_per_actor (now 4,096)"),
    (A3C, ("a3c.workers=1000000",), ("validate", "launch"), "a3c.workers",
     "lower a3c.workers (now 1,000,000: a world of 1,000,001 ranks)"),
    (CARTPOLE, ("topology.learners=4096", "replay.batch_size=4096"), ("launch",), "topology.learners",
     "lower topology.learners (now 4,096: a world of 4,099 ranks)"),
    (str(JOBS / "taxi_distql.toml"), ("distql.workers=1000000",), ("validate",), "distql.workers",
     "lower distql.workers (now 1,000,000: a world of 1,000,001 ranks)"),
    (str(JOBS / "predator_prey_qmix.toml"), ("topology.actors=100000",), ("validate",), "topology.actors",
     "lower topology.actors (now 100,000"),
    # the parameter server alone, with one worker, would not fit: the network's width, not the count of ranks
    (A3C, ("agent.hidden=[65536, 65536]",), ("validate",), "agent.hidden", "use a smaller network (agent.hidden"),
    # the learner's batch is batch_size x (unroll + 1) steps: the one of the two raised a million-fold
    (IMPALA, ("replay.batch_size=1000000", "replay.capacity=2000000"), ("validate",), "replay.batch_size",
     "lower replay.batch_size (now 1,000,000) or impala.unroll"),
])
def test_a_refusal_names_the_setting_whose_change_shrinks_the_need_most(tmp_path, job, sets, commands, key, fix,
                                                                      capsys):
    """The memory preflight names what makes a job too big for a node: the count of ranks (a world of a million
    actors or workers, thousands of learners), a worker's rollout (unroll x envs), not the replay's capacity or the
    network's width that the defaults leave small; never a count of ranks when one rank alone would still not fit,
    and of settings that size one part together, the one that departs most from its default."""
    flags = [x for s in sets for x in ("--set", s)]
    for command in commands:
        proc = refusal(capsys, command, job, "--set", f'run.out_dir="{tmp_path}"', *flags)
        lines = error_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
        assert lines[0].startswith(f"mpirl: error: {key}: the job needs about "), lines[0]
        assert fix in lines[0] and "Traceback" not in proc.stderr, lines[0]
    assert not any(tmp_path.iterdir())


def test_a_nodes_check_counts_what_the_jobs_own_ranks_already_hold(monkeypatch):
    """Inside the job each node is checked after its ranks started: the memory they hold by then (their imports)
    is theirs, so a job is not refused by its own ranks' footprint, and is refused when it does not fit even so."""
    from mpirl.job import wiring as job

    class OneRank:  # a world of one rank: what the check asks of its communicator
        rank = 0

        def allgather(self, x):
            return [x]

    assert memory.held_bytes() > 10 * 2**20  # this process: Python, numpy, torch's imports
    cfg, _ = config.load(JOBS / "cartpole.toml")
    est = memory.Estimate({"learner": 2 * 2**30}, {"learner": 1})
    need = memory.LIBRARIES + 2 * 2**30
    monkeypatch.setattr(memory, "available_bytes", lambda: need - 2**30)  # 1 GiB short on what the node has free
    monkeypatch.setattr(memory, "held_bytes", lambda: 2**30 + 2**20)  # ... which the rank holds already
    job._agree_on_local_checks(OneRank(), cfg, est, "learner")
    monkeypatch.setattr(memory, "held_bytes", lambda: 2**29)
    with pytest.raises(config.ConfigError, match="the job needs about"):
        job._agree_on_local_checks(OneRank(), cfg, est, "learner")


@pytest.mark.mpi
def test_a_rollout_of_more_games_than_steps_is_named_by_its_games(tmp_path):
    """Four workers whose rollouts fit one by one but not together (launch checks them together), each of 4,096
    games and fewer steps: env.envs_per_actor is named, with a3c.unroll beside it."""
    unroll = int(0.75 * memory.available_bytes() / (4096 * 1100))  # about 1.1 KB a CartPole step and its loss
    if not 1 <= unroll < 4096:
        pytest.skip(f"this node's memory makes it {unroll} steps, not fewer than the games")
    proc = run_cli("launch", A3C, "--set", f'run.out_dir="{tmp_path}"', "--set", f"a3c.unroll={unroll}",
                   "--set", "env.envs_per_actor=4096")
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith("mpirl: error: env.envs_per_actor: the job needs about "), lines[0]
    assert f"lower a3c.unroll (now {unroll:,}) or env.envs_per_actor (now 4,096)" in lines[0]
    assert not any(tmp_path.iterdir())
