"""The benchmark suite runs end to end at a tiny scale and reports what it measured.

No timing is asserted (the machines are shared and noisy): these tests check that
every benchmark measures both sides, that ratios follow from the medians, that the
HDF5 file holds the repetitions, and that the command line refuses bad input.
"""

import os
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpirl.bench import replay
from mpirl.bench.report import Row, format_rows, write_rows
from mpirl.bench.suite import summary

from conftest import JOBS, bad_targets, run_cli, tree


def test_row_ratio_and_targets():
    r = Row("x", "1/s", "ours", "ref", values={"ours": [2.0, 4.0, 3.0], "ref": [1.0, 1.5, 2.0]}, target=2.0)
    assert r.ratio == pytest.approx(3.0 / 1.5) and r.met
    slow = Row("t", "s", "ours", "ref", values={"ours": [4.0], "ref": [2.0]}, higher_is_better=False, target=1.0)
    assert slow.ratio == pytest.approx(0.5) and slow.met is False  # ours takes twice as long
    cap = Row("m", "bytes", "ours", "ref", values={"ours": [7000.0], "ref": [56000.0]}, higher_is_better=False,
              at_most=16_384)
    assert cap.met and "met" in format_rows("t", [cap]) and "MISSED" in summary({"b": [slow]})
    # Times to a threshold, lower is better; inf: never reached within the budget.
    inf = float("inf")
    only_ours = Row("t", "s", "ours", "ref", values={"ours": [20.0, 30.0, 25.0], "ref": [inf, 40.0, inf]},
                    higher_is_better=False, target=1.0)
    assert only_ours.ratio == float("inf") and only_ours.met is True
    assert "infx  target >= 1x: met" in format_rows("t", [only_ours]) and ": met" in summary({"b": [only_ours]})
    only_ref = Row("t", "s", "ours", "ref", values={"ours": [inf] * 3, "ref": [20.0, 30.0, 25.0]},
                   higher_is_better=False, target=1.0)
    assert only_ref.ratio == 0 and only_ref.met is False
    neither = Row("t", "s", "ours", "ref", values={"ours": [inf], "ref": [inf]},
                  higher_is_better=False, target=1.0)
    assert np.isnan(neither.ratio) and neither.met is None and "MISSED" in summary({"b": [neither]})
    # A model against a measurement: met within 1 +- within, on either side
    over = Row("m", "1/s", "model", "measured", values={"model": [1.25], "measured": [1.0]}, within=0.2)
    under = Row("m", "1/s", "model", "measured", values={"model": [0.85], "measured": [1.0]}, within=0.2)
    assert over.met is False and under.met is True
    assert "within 20 %: MISSED" in format_rows("t", [over]) and "within 20 %: met" in summary({"b": [under]})
    # A quantity told for every side (a learner's busy share): the sides' figures, no ratio of ours with itself
    told = Row("busy", "share", "ours", "ours", values={"ours": [0.9], "lib": [0.2]}, note="40 s")
    text = format_rows("t", [told])
    assert "ratio" not in text and "0.9" in text and "0.2" in text and "(40 s)" in text


def test_replay_bench_measures_ours_cpprb_and_the_floor(tmp_path):
    import cpprb  # noqa: F401  (in the test extra: a missing one fails)
    rows = replay.run(reps=5, capacity=1024, seconds=0.01)
    names = [r.name for r in rows]
    assert any("atari insert" in n for n in names) and any("cartpole priority update" in n for n in names)
    assert any("gather floor" in n for n in names)
    for r in rows:
        for impl, values in r.values.items():
            assert all(np.isfinite(values)) and all(v > 0 for v in values), (r.name, impl)
        if "memory" not in r.name:
            assert len(r.values[r.ours]) == 5 and np.isfinite(r.ratio)
    memory = next(r for r in rows if r.name == "atari memory per slot")
    assert memory.median(memory.ours) <= 16_384 < memory.median(memory.reference)  # frames stored once
    write_rows(tmp_path / "b.h5", "replay", rows)
    with h5py.File(tmp_path / "b.h5", "r") as f:
        g = f["replay/atari insert (messages of 64)"]
        assert len(g[rows[0].ours][()]) == 5 and g.attrs["ratio"] == pytest.approx(rows[0].ratio)
        assert f["replay"].attrs["cores"] >= 1


@pytest.mark.mpi
def test_transport_and_actor_benches_run_two_ranks():
    from mpirl.bench import actor, transport
    rows = transport.run(reps=5, seconds=0.01)
    gbs = [r for r in rows if r.unit == "GB/s"]
    assert {r.name.split()[1] for r in gbs} == {"cartpole", "atari"}
    assert all(len(r.values[r.ours]) == len(r.values[r.reference]) == 5 and r.ratio > 0 for r in gbs)
    rows = actor.run(reps=5, seconds=0.1)
    assert rows and all(r.ratio > 0 and len(r.values[r.ours]) == 5 for r in rows)


def test_cache_bench_counts_bytes_and_rebuild_time_three_ways():
    from mpirl.bench import cache
    rows = cache.run(reps=1, steps=24, shapes=(("tiny", 512, 16, 4.0, 8),))
    assert [r.ours for r in rows] == [cache.CACHE, cache.PLAIN, cache.CACHE]
    with_cache, plain, rebuild = rows
    b = {k: v[0] for r in (with_cache, plain) for k, v in r.values.items()}
    # A batch of 16 from 512 slots: the cache holds nearly every frame the batches draw, a plain reply sends each
    # distinct one; a dump of 512 slots every 8 batches of 16 costs about 4 frames a trained experience.
    assert 0 < b[cache.CACHE] < b[cache.PLAIN] and 0 < b[cache.CACHE] < b[cache.BASELINE]
    assert with_cache.target == 2.0 and plain.target is None
    assert all(v[0] > 0 for v in rebuild.values.values())


@pytest.mark.mpi
def test_pipeline_bench_reads_compute_and_waiting_from_real_jobs():
    from mpirl.bench import pipeline

    # One of the three links and two of the three depths: the suite's time; the bench itself runs all nine.
    # Each job runs until its learner has logged 3 intervals with training, however long that takes here.
    rows = pipeline.run(reps=3, seconds=3, job=str(JOBS / "cartpole.toml"), links=pipeline.LINKS[2:],
                        prefetches=(0, 2))
    (wan,) = rows  # 1 Gbit/s + 20 ms: without prefetch the learner waits a 40 ms round trip per batch
    assert set(wan.values) == {"prefetch 0", "prefetch 2"}
    assert all(0 <= v <= 100 for vs in wan.values.values() for v in vs)
    assert wan.median("prefetch 0") > 0 and wan.at_most is None
    assert pipeline.row(*pipeline.LINKS[1][:2], "cartpole.toml").at_most == 10.0  # the issue's bound: 25 GbE + 10 km


@pytest.mark.mpi
def test_solve_bench_reports_thresholds_never_reached():
    import stable_baselines3  # noqa: F401  (in the test extra: a missing one fails)
    from mpirl.bench import solve
    before = set(Path(tempfile.gettempdir()).glob("SB3-*"))
    rows = solve.run(reps=1, budget=1500, wall=30)
    assert set(Path(tempfile.gettempdir()).glob("SB3-*")) == before, "SB3 left a log directory behind"
    assert [r.name.split(" to ")[1].split()[0] for r in rows] == ["195", "195", "475", "475"]
    for r in rows:
        assert set(r.values) == {"mpirl 4 ranks", "SB3 DQN (zoo)"} and all(len(v) == 1 for v in r.values.values())
    # 1,500 env steps are not enough to average 475 over 20 episodes: neither reaches it, so no verdict
    assert "not reached" in rows[2].note and rows[3].values["SB3 DQN (zoo)"] == [float("inf")]
    assert not rows[2].met and "not reached" in format_rows("solve", rows)


def test_bench_command_line_refuses_bad_input(tmp_path, capsys):
    proc = run_cli("bench", "replay", "--reps", "3")
    assert proc.returncode == 2 and "--reps" in proc.stderr
    (tmp_path / "old.h5").write_bytes(b"results")
    proc = run_cli("bench", "replay", "--out", str(tmp_path / "old.h5"))
    assert proc.returncode == 2 and "exists" in proc.stderr
    assert (tmp_path / "old.h5").read_bytes() == b"results"  # never overwritten
    from mpirl import cli  # in this process: the refusals come before any bench starts
    places = tmp_path / "places"
    places.mkdir()
    for path, extra, says in bad_targets(places, ".h5", force=""):
        before = tree(places)
        capsys.readouterr()
        assert cli.main(["bench", "replay", "--out", str(path), *extra]) == 2, path
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("mpirl: error: --out: ") and says in err, err
        assert tree(places) == before, path
    proc = run_cli("bench", "replya")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    proc = run_cli("bench", "continuous", "--tasks", "pendulum,atari")
    assert proc.returncode == 2 and "--tasks" in proc.stderr and "atari" in proc.stderr
    proc = run_cli("bench", "continuous", "--reps", "3", "--tasks", "pendulum,hopper")  # 3 only for the long rows
    assert proc.returncode == 2 and "--reps" in proc.stderr and "hopper, halfcheetah, novelocity" in proc.stderr
    proc = run_cli("bench", "continuous", "--reps", "2", "--tasks", "hopper")
    assert proc.returncode == 2 and "at least 3" in proc.stderr
    proc = run_cli("bench", "solve", "--tasks", "pendulum")
    assert proc.returncode == 2 and "--tasks" in proc.stderr
    for wall in ("0", "nan", "-5"):
        proc = run_cli("bench", "atari", "--atari-wall", wall)
        assert proc.returncode == 2 and "--atari-wall" in proc.stderr
    proc = run_cli("bench", "atari", "--game", "tetris")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    for extra, says in ((("--breakout-steps", "0"), "env steps >= 1"), (("--breakout-steps", "1.5"), "invalid int"),
                        (("--breakout-steps", "100", "--breakout-wall", "0"), "leaves the Breakout rows out")):
        proc = run_cli("bench", "impala", *extra)
        assert proc.returncode == 2 and "--breakout-steps" in proc.stderr and says in proc.stderr, proc.stderr
    proc = run_cli("bench", "replay", "--breakout-steps", "100")
    assert proc.returncode == 2 and "only `mpirl bench impala`" in proc.stderr, proc.stderr


def test_bench_command_line_hands_the_breakout_steps_to_the_impala_bench(tmp_path, monkeypatch, capsys):
    """``--breakout-steps`` reaches :func:`mpirl.bench.impala.run` (None when left out: the wall alone), and from
    there the Breakout rows' ``budget``."""
    from mpirl import cli
    from mpirl.bench import impala, suite
    seen = []
    monkeypatch.setattr(suite, "run", lambda what, reps, out, **opts: seen.append(opts["impala"]) or 0)
    assert cli.main(["bench", "impala", "--out", str(tmp_path / "a.h5"), "--breakout-steps", "20000"]) == 0
    assert cli.main(["bench", "impala", "--out", str(tmp_path / "b.h5")]) == 0
    assert seen == [{"breakout_wall": 60.0, "breakout_steps": 20000}, {"breakout_wall": 60.0, "breakout_steps": None}]
    budgets, played = [], {"env_steps_sampled": 3000, "seconds": 1.0}  # a CartPole run's figures, no jobs started
    monkeypatch.setattr(impala, "ours", lambda seed, budget, wall, tmp: played)
    monkeypatch.setitem(impala.REFERENCES, "Sample Factory APPO", lambda seed, budget, wall: played)
    monkeypatch.setattr(impala, "crossing_rows", lambda *a, **k: [])
    monkeypatch.setattr(impala, "breakout", lambda reps, wall, refs, budget: budgets.append((wall, refs, budget)) or [])
    for steps in (20000, None):
        impala.run(reps=1, references=("Sample Factory APPO",), breakout_wall=5, breakout_steps=steps)
    assert budgets == [(5, ("Sample Factory APPO",), 20000), (5, ("Sample Factory APPO",), impala.BREAKOUT_BUDGET)]


@pytest.mark.mpi
def test_continuous_bench_times_both_sides_from_launch_to_the_crossing(tmp_path):
    """Both sides of a Pendulum row, with a target random play reaches in its first 20 episodes: each gives the
    seconds from its launch (start-up included, a few seconds) and the env steps it played to the crossing."""
    from mpirl.bench import continuous
    ours = continuous.ours_crossing("pendulum_ppo.toml", 2, [], -1600.0, 1, tmp_path, "pendulum")
    sb3 = continuous.sb3_run("Pendulum-v1", 1, -1600.0)
    for side in (ours, sb3):
        assert 0.5 < side["seconds"] < 600 and 4000 <= side["env_steps"] <= 100_000, (ours, sb3)


@pytest.mark.mpi
def test_workers_bench_measures_all_four_ways_from_real_jobs():
    import pettingzoo  # noqa: F401  (in the test extra: a missing one fails)
    from mpirl.bench import workers
    # A rate over 1 s (it must be > 0), on a smaller game than the bench's (the suite's time): 2 predators and 2 prey
    # on a 5x5 grid, 25-step episodes, so every sender's rows come in early.
    small = ("env.predator_prey.predators=2", "env.predator_prey.grid=5", "env.max_episode_steps=25")
    rows = workers.run(reps=1, seconds=1, cases=("qmix",), extra=small)
    assert [r.ours for r in rows] == ["AWL", "AW", "actors infer"] and all(r.reference == "single process" for r in rows)
    for r in rows:
        assert all(v[0] > 0 for v in r.values.values()), r.values  # env steps/s, measured on each side
        assert r.ratio == pytest.approx(r.median(r.ours) / r.median(r.reference))


def test_workers_bench_single_process_apex_plays_and_counts_env_steps(monkeypatch):
    """The Ape-X single-process sampler (the bench runs it on Breakout) on CartPole: games, decisions, priorities."""
    from mpirl.bench import workers
    case = workers.Case("apex", "CartPole", JOBS / "cartpole.toml", 2, ())
    counted = []
    timed = workers._timed

    def watched(step, count, seconds):  # what one step of the sampler counts, then the bench's own timing
        before = count()
        step()
        counted.append(count() - before)
        return timed(step, count, seconds)
    monkeypatch.setattr(workers, "_timed", watched)
    assert workers.single_process(case, games=2, seconds=0.5) > 0  # env steps/s, however fast this machine is
    assert counted == [2]  # a step plays each of the 2 games once


@pytest.mark.mpi
def test_distql_bench_measures_the_merge_and_both_reply_modes_from_real_jobs():
    from mpirl.bench import distql
    rows = {r.name.split(":")[0] + ":" + r.name.split(":")[1][:12]: r
            for r in distql.run(reps=1, seconds=0.05, episodes=100)}
    merge, exchange, rate, moved, reply = rows.values()
    assert merge.values[distql.OURS][0] > 0 and merge.values[distql.FLOOR][0] > 0
    assert exchange.values[distql.ALL][0] > 0 and exchange.values[distql.PARTIAL][0] > 0
    assert rate.values[distql.ALL][0] > 0 and rate.values[distql.PARTIAL][0] > 0
    # an ALL reply carries every pair the server holds, Partial only the worker's own: ALL moves more bytes,
    # and never more than the whole table
    assert moved.values[distql.ALL][0] > moved.values[distql.PARTIAL][0] > 0 and moved.ratio > 1
    assert 0 < reply.values[distql.ALL][0] <= reply.values["whole table"][0] == 32 + 20 * 3000


@pytest.mark.mpi
def test_fairness_bench_reads_both_actors_rates_from_a_real_job():
    from mpirl.bench import fairness
    rows = fairness.run(reps=1, seconds=3)
    (r,) = rows
    assert r.at_most == 1.5 and len(r.values[r.ours]) == 1 and r.values[r.ours][0] >= 1.0  # faster over slower
    assert "env steps/s" in r.note


def test_learner_bench_times_our_train_step_and_the_bare_one_on_the_same_batch():
    import ale_py  # noqa: F401  (in the test extra: a missing one fails)
    from mpirl.bench import learner
    rows = learner.run(reps=1, seconds=0.01, layout_batch=4)
    assert [r.name.split(",")[1].strip() for r in rows[:2]] == ["cartpole", "breakout"]
    assert rows[2].name == "Nature CNN training pass, channels-last input, cpu" and "batch 4" in rows[2].note
    for r in rows:
        assert all(v > 0 for vs in r.values.values() for v in vs) and np.isfinite(r.ratio)


def test_learner_bench_on_cuda_without_a_gpu_is_exit_2_naming_the_device(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = run_cli("bench", "learner", "--device", "cuda", "--out", str(tmp_path / "b.h5"))
    assert proc.returncode == 2 and proc.stderr.startswith("mpirl: error: --device: 'cuda' but torch sees no CUDA"), (
        proc.stderr)
    proc = run_cli("bench", "replay", "--device", "cpu", "--out", str(tmp_path / "b.h5"))
    assert proc.returncode == 2 and "--device: only `mpirl bench learner` takes a device" in proc.stderr
    assert not any(tmp_path.iterdir())
    from mpirl.bench import learner
    with pytest.raises(RuntimeError, match="no CUDA device"):
        learner.run(reps=1, seconds=0.01, device="cuda")


@pytest.mark.mpi
def test_startup_bench_breaks_a_launch_into_its_phases_against_the_floor():
    """One launch of the Ape-X job and one of its floor (rank 0 alone imports torch, as the job's learner; the a3c
    row's floor, every rank with torch, is the same code with other imports and costs the suite 10 CPU-s more):
    every phase of the breakdown was seen (the marks of the launcher and of every rank made it), each a duration of
    its own, and the row holds both sides with the target it was given."""
    from mpirl.bench import startup
    rows = startup.run(reps=1, jobs=[("cartpole.toml", 4, "", "torch", 3.0)])
    (row,) = rows
    assert row.at_most == 3.0 and set(row.values) == {"ours", "job wall (not counted)", row.reference}
    assert all(v[0] > 0 for v in row.values.values()) and np.isfinite(row.ratio)
    assert startup.floor_once(2, "torch", "") > 0  # every rank imports torch, as the a3c job's do


def test_a_launch_is_broken_into_phases_from_its_marks(tmp_path):
    """The breakdown from the marks a launch leaves: the launcher's, the first and the last rank to get there."""
    from mpirl import phases
    from mpirl.bench import startup
    lines = [(0.0, 10, "-", "process"), (0.5, 10, "-", "mpiexec started"), (0.6, 11, "0", "process"),
             (0.7, 12, "1", "process"), (1.0, 11, "0", "imported"), (1.1, 12, "1", "imported"),
             (1.2, 11, "0", "MPI initialized"), (1.3, 12, "1", "MPI initialized"), (2.0, 11, "0", "imported roles"),
             (2.5, 12, "1", "imported roles"), (2.6, 11, "0", "checked"), (2.6, 12, "1", "checked"),
             (2.7, 11, "0", "wired"), (2.8, 12, "1", "wired"), (3.0, 12, "1", "games started"),
             (5.0, 12, "1", "role ended"), (5.2, 11, "0", "role ended"), (5.3, 11, "0", "all ended"),
             (5.3, 12, "1", "all ended"), (5.4, 11, "0", "run file finished"), (5.5, 12, "1", "exit"),
             (5.6, 11, "0", "exit"), (5.8, 10, "-", "mpiexec ended")]
    path = tmp_path / "marks.txt"
    path.write_text("".join(f"{t} {pid} {rank} 0.0 {phase}\n" for t, pid, rank, phase in lines))
    parts = startup.breakdown(phases.read(path), 10, 6.0)
    assert parts["launcher: Python, reading the job"] == pytest.approx(0.5)
    assert parts["mpiexec starts the ranks"] == pytest.approx(0.2)  # to the last rank's start
    assert parts["ranks: imports"] == pytest.approx(1.2)
    assert parts["ranks: wired -> the first rank's games reset"] == pytest.approx(0.2)  # the first rank to reset
    assert parts["rank 0: run file finished, summary printed"] == pytest.approx(0.2)
    assert parts["ranks' MPI_Finalize and exits, mpiexec's end"] == pytest.approx(0.2)
    assert parts["launcher: its own end"] == pytest.approx(0.2)


def test_marks_to_a_file_the_process_cannot_open_are_dropped_not_fatal(tmp_path):
    """A Slurm job's ranks see their own ``/tmp``: a ``MPIRL_PHASES`` there cannot be opened, and the marks stop
    rather than end the rank (they did, at its last mark: the job then failed after finishing its work)."""
    import subprocess
    import sys
    code = "from mpirl import phases; phases.mark('imported'); phases.mark('exit'); print('ended')"
    missing = tmp_path / "gone" / "marks.txt"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MPIRL_PHASES": str(missing)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ended", proc.stderr
    assert not missing.parent.exists()


def test_atari_rows_set_ours_beside_each_library_and_the_best_one_in_like_counts():
    """Frames are agent steps x frame skip for every side; a library whose trained count is not known has no trained
    rows; the best library per quantity is the one with the highest median; start-up and busy shares are told."""
    from mpirl.bench import atari

    def run(steps, trained, seconds, busy=None, start=10.0, frameskip=4):
        return {"env_steps_sampled": steps, "env_steps_trained": trained, "seconds": seconds, "learner_busy": busy,
                "start_seconds": start, "frameskip": frameskip}

    results = {atari.IMPALA: [run(3000, 2000, 60.0, 0.9), run(3600, 2400, 60.0, 0.95)],
               "Sample Factory APPO": [run(1500, 6000, 60.0), run(1500, 6000, 60.0)],
               "RLlib APPO": [run(2400, None, 60.0), run(2400, None, 60.0)]}
    rows = {r.name: r for r in atari.rows_of(results, "pong", 60.0)}
    frames = rows["Atari pong env frames/s collected: mpirl IMPALA async vs the best library (RLlib APPO)"]
    assert frames.median(atari.IMPALA) == pytest.approx((3000 + 3600) / 2 * 4 / 60)  # frames/s: steps x 4 / s
    assert frames.ratio == pytest.approx(220 / 160) and frames.target == atari.TARGET and not frames.met
    trained = rows["Atari pong samples/s trained (every pass): mpirl IMPALA async vs the best library "
                   "(Sample Factory APPO)"]
    assert trained.ratio == pytest.approx(36.67 / 100, rel=1e-3)
    assert not any("trained" in name and "RLlib" in name for name in rows)  # its count unknown: no row
    busy = rows["Atari pong learner busy: mpirl IMPALA async"]
    assert set(busy.values) == {atari.IMPALA} and busy.target is None  # the libraries' shares unknown here
    assert "Atari pong start-up to the first env step: mpirl IMPALA async" in rows


def test_impala_bench_says_when_our_run_trained_nothing_rather_than_failing_on_an_empty_table(tmp_path):
    """A run whose wall went by in the start-up (the learner's ``train`` table empty, as a loaded machine left one
    of the Breakout rows' runs) is an error naming the run, its stop and the remedy, not an IndexError."""
    from mpirl.bench import impala
    with h5py.File(tmp_path / "run.h5", "w") as f:
        learner = f.create_group("learner")
        learner.attrs.update(stop_reason="wall_seconds 6 reached", unroll=20)
        for column in ("time", "env_steps", "samples_trained"):
            learner.create_dataset(f"train/{column}", shape=(0,), maxshape=(None,), dtype="f8")
    with pytest.raises(RuntimeError, match=r"trained nothing before its stop \(wall_seconds 6 reached\).*longer wall"):
        impala.counts(tmp_path)
