"""The analysis scripts read real runs: study table and figures, solve table, curves."""

import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import ROOT, run_mpi

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """One short proposed and one short baseline run, laid out as the study lays them out."""
    out = tmp_path_factory.mktemp("study")
    for arch in ("proposed", "baseline"):
        job = run_mpi(4, out / "link-none-base", f"replay.architecture={arch}", "run.train_steps=300",
                      "run.target_return=nan", "replay.learning_starts=300", "replay.n_replay=50")
        assert job.proc.returncode == 0, job.output
    return out


def script(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_study_table_and_figures(pair):
    proc = script("analysis/study.py", "--runs", str(pair))
    assert proc.returncode == 0, proc.stderr
    table = (pair / "table.txt").read_text()
    for label in ("loss, converged half", "transferred priority", "sampled priority", "generated / consumed",
                  "learner comm %", "actor experiences/s", "learner experiences/s", "link bytes / trained exp",
                  "experience bytes / trained exp",
                  "return, last 20 %, all", "return, last 20 %, least-exploring"):
        line = next(l for l in table.splitlines() if label in l)
        proposed, baseline, ratio = (float(x) for x in line.split("|")[0].split()[-3:])  # medians, then ranges
        assert proposed > 0 and baseline > 0 and ratio == pytest.approx(proposed / baseline, rel=1e-2)
    assert (pair / "link-none-base.png").stat().st_size > 10_000
    for quantity in ("loss", "p_t"):  # the paper's figure, one PNG per quantity over time
        assert (pair / f"link-none-base-{quantity}.png").stat().st_size > 10_000
    assert "L_t last / third quarter" in table and "every run:" in table


def test_solve_table_and_curves_read_the_runs(pair):
    proc = script("analysis/solve_table.py", "--runs", str(pair / "link-none-base"))
    assert proc.returncode == 0, proc.stderr
    assert "proposed" in proc.stdout and "baseline" in proc.stdout
    run_dir = next((pair / "link-none-base").glob("*/run.h5")).parent
    proc = script("analysis/curves.py", str(run_dir), "-o", str(pair / "c.png"))
    assert proc.returncode == 0 and (pair / "c.png").exists()


def test_random_play_level_and_runs_against_it(pair):
    """The script's level is CartPole's random-play level, and its per-run rows are the runs' own episodes.

    300 train steps do not yet beat random play (early DQN often collapses onto one action, about 9
    per episode), so this checks the arithmetic; tests/test_learning.py checks solved runs beat it.
    """
    runs = sorted(p.parent for p in (pair / "link-none-base").glob("*/run.h5"))
    proc = script("analysis/random_play.py", "jobs/cartpole.toml", "--episodes", "50", "--runs", *map(str, runs))
    assert proc.returncode == 0, proc.stderr
    level, level_se = (float(proc.stdout.split("random play")[1].split()[i]) for i in (1, 3))
    assert 10 < level < 40  # CartPole-v1 under uniform random actions: about 22
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith("all actors")]
    assert len(rows) == len(runs) == 2
    for run, row in zip(runs, rows):
        mean, se, n, z = float(row[3]), float(row[5]), int(row[7]), float(row[-1])
        with h5py.File(run / "run.h5", "r") as f:
            t = np.concatenate([f[b]["episodes/time"][()] for b in f if b.startswith("buffer_")])
            ret = np.concatenate([f[b]["episodes/return"][()] for b in f if b.startswith("buffer_")])
        tail = ret[t >= t.max() - 0.2 * (t.max() - t.min())]
        assert n == len(tail) > 1 and mean == pytest.approx(tail.mean(), abs=0.01)
        assert z == pytest.approx((tail.mean() - level) / np.hypot(tail.std(ddof=1) / np.sqrt(n), level_se), abs=0.1)


def test_replay_profile_takes_the_atari_sample_and_insert_apart():
    proc = script("analysis/replay_profile.py", "--capacity", "1024", "--reps", "1")
    assert proc.returncode == 0, proc.stderr
    times = {line.rsplit(None, 2)[0].strip(): float(line.split()[-2])
             for line in proc.stdout.splitlines() if line.endswith(" us")}
    for part in ("sample into the reply", "tree descent (no gather)", "distinct frames, compiled",
                 "distinct frames, np.unique", "gather floor (in turns with the sample)", "insert of one message",
                 "plain copy of its frames"):
        assert times[part] > 0, (part, proc.stdout)
    assert any(k.startswith("copy of the batch's") for k in times), proc.stdout
    assert "huge pages backing ours" in proc.stdout


def _episodes_file(path, game: str, runs: dict) -> str:
    """A file as ``analysis/atari_learning.py`` keeps its episodes: ``{"side/seedN": rows}``."""
    with h5py.File(path, "w") as f:
        f.attrs["game"] = game
        for name, rows in runs.items():
            f[name] = rows
    return str(path)


def test_atari_learning_draws_and_tabulates_kept_episodes_at_equal_frames_and_hours(tmp_path):
    """``analysis/atari_learning.py --redraw``: the episodes of each side (seconds since its first env step,
    length, return) as a PNG of both axes and a table of the last-20 mean at equal frames and hours."""
    rising = np.column_stack([np.arange(1, 101) * 36.0, np.full(100, 1000), np.linspace(-21, 0, 100)])
    flat = np.column_stack([np.arange(1, 41) * 90.0, np.full(40, 2000), np.full(40, -20.0)])
    runs = _episodes_file(tmp_path / "runs.h5", "pong", {"mpirl IMPALA async/seed1": rising,
                                                         "Sample Factory APPO/seed1": flat})
    redraw = lambda *files, out: script("analysis/atari_learning.py", "--redraw", *files,  # noqa: E731
                                        "--out", str(tmp_path / out))
    proc = script("analysis/atari_learning.py", "--redraw", runs)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "runs.png").stat().st_size > 10_000
    lines = proc.stdout.splitlines()
    ours = next(l for l in lines if l.startswith("mpirl IMPALA async")).split()
    theirs = next(l for l in lines if l.startswith("Sample Factory APPO")).split()
    # Both reach 3,600 s; frames: ours 400,000 (100 x 1000 x 4), theirs 320,000: the common span is 320,000 frames.
    assert "0.32M" in lines[1] and "1.00 h" in lines[1]
    # At 320,000 frames ours has finished 80 episodes: the mean of episodes 61..80 of the line from -21 to 0.
    assert float(ours[5]) == pytest.approx(np.linspace(-21, 0, 100)[60:80].mean(), abs=0.05)
    assert float(theirs[5]) == -20.0 and float(theirs[8]) == -20.0  # all of it, by frames and by hours
    assert ours[-3:] == ["100", "400,000", "1.00"]
    bad = script("analysis/atari_learning.py", "--which", "impala,dqn")
    assert bad.returncode == 2 and "--which" in bad.stderr
    # Several files: their sides together, saved beside --out; one seed of a side twice, or another game, refused.
    both = redraw(runs, _episodes_file(tmp_path / "ppo.h5", "pong", {"mpirl PPO allreduce/seed1": rising}),
                  out="all.png")
    assert both.returncode == 0, both.stderr
    assert any(l.startswith("mpirl PPO allreduce") for l in both.stdout.splitlines())
    with h5py.File(tmp_path / "all.h5", "r") as f:
        assert sorted(f) == ["Sample Factory APPO", "mpirl IMPALA async", "mpirl PPO allreduce"]
    # A later call's seed 2 of a side joins the earlier call's seed 1: the table is their median.
    two = redraw(runs, _episodes_file(tmp_path / "seed2.h5", "pong", {"mpirl IMPALA async/seed2": flat}),
                 out="two.png")
    assert two.returncode == 0, two.stderr
    with h5py.File(tmp_path / "two.h5", "r") as f:
        assert sorted(f["mpirl IMPALA async"]) == ["seed1", "seed2"] and f.attrs["seeds_done"] == 1
    ours2 = next(l for l in two.stdout.splitlines() if l.startswith("mpirl IMPALA async")).split()
    assert float(ours2[-1]) == 1.0  # the median of the two seeds' hours
    # at the whole hour: the median of seed 1 (the last 20 of the line) and seed 2 (-20)
    assert float(ours2[8]) == pytest.approx((np.linspace(-21, 0, 100)[80:].mean() - 20.0) / 2, abs=0.05)
    seeds = [l.split() for l in two.stdout.splitlines() if l.startswith("  seed ")]  # each under the median
    assert [s[:2] for s in seeds] == [["seed", "1"], ["seed", "2"]]
    assert float(seeds[0][7]) == pytest.approx(np.linspace(-21, 0, 100)[80:].mean(), abs=0.05)
    assert float(seeds[1][7]) == -20.0  # at the whole hour, each its own
    _episodes_file(tmp_path / "breakout.h5", "breakout", {"mpirl PPO allreduce/seed1": rising})
    for second, said in (("all.h5", "seed 1 of 'Sample Factory APPO' is in two of the files"),
                         ("breakout.h5", "differs from")):
        refused = redraw(runs, str(tmp_path / second), out="other.png")
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
    assert not (tmp_path / "other.h5").exists() and not (tmp_path / "other.png").exists()
    # A variant run before its setting had a name: renamed on redraw, beside the side run as the job files now are.
    variant = _episodes_file(tmp_path / "variant.h5", "pong", {"mpirl PPO allreduce/seed1": flat})
    named = redraw(str(tmp_path / "ppo.h5"), variant, "--rename", "mpirl PPO allreduce=mpirl PPO allreduce [old]",
                   out="named.png")
    assert named.returncode != 0  # both files hold seed 1 of one side until the rename, which comes after joining
    named = redraw(variant, "--rename", "mpirl PPO allreduce=mpirl PPO allreduce [old]", out="named.png")
    assert named.returncode == 0, named.stderr
    with h5py.File(tmp_path / "named.h5", "r") as f:
        assert sorted(f) == ["mpirl PPO allreduce [old]"]
    assert any(l.startswith("mpirl PPO allreduce [old]") for l in named.stdout.splitlines())
    # A variant's name holds its settings' "=": renamed whole.
    long = _episodes_file(tmp_path / "long.h5", "pong", {"mpirl PPO allreduce [agent.lr=1, env.x=2]/seed1": flat})
    short = redraw(long, "--rename", "mpirl PPO allreduce [agent.lr=1, env.x=2]=mpirl PPO allreduce [fast]",
                   out="short.png")
    assert short.returncode == 0, short.stderr
    with h5py.File(tmp_path / "short.h5", "r") as f:
        assert sorted(f) == ["mpirl PPO allreduce [fast]"]
    # A side of the files left out of the figure, its table and the file saved beside --out.
    dropped = redraw(str(tmp_path / "all.h5"), "--drop", "mpirl IMPALA async", out="dropped.png")
    assert dropped.returncode == 0, dropped.stderr
    with h5py.File(tmp_path / "dropped.h5", "r") as f:
        assert sorted(f) == ["Sample Factory APPO", "mpirl PPO allreduce"]
    assert not any(l.startswith("mpirl IMPALA") for l in dropped.stdout.splitlines())
    for args, said in ((("--redraw", runs, "--rename", "nobody=x", "--out", str(tmp_path / "o.png")),
                        "'nobody' is not a side"),
                       (("--rename", "a=b"), "--rename: only with --redraw"),
                       (("--drop", "x"), "--drop: only with --redraw"),
                       (("--redraw", runs, "--drop", "nobody", "--out", str(tmp_path / "o.png")),
                        "--drop: 'nobody' is not a side"),
                       (("--redraw", runs, "--set", "agent.lr=1"), "--set: settings are for new runs"),
                       (("--which", "sf", "--set", "agent.lr=1"), "--which names no side of ours"),
                       (("--which", "sf,sb3", "--set", "agent.lr=1"), "--which names no side of ours"),
                       (("--set", "agent.lr"), "--set: KEY=VALUE pairs"),
                       (("--which", "ppo", "--set", "agent.lr=-1", "--out", str(tmp_path / "o.png")),
                        "--set: ppo_pong.toml refuses it: mpirl: error: agent.lr")):
        refused = script("analysis/atari_learning.py", *args)
        assert refused.returncode == 2 and said in refused.stderr, (args, refused.stderr)
    assert not (tmp_path / "o.png").exists() and not (tmp_path / "o.h5").exists()


def test_sb3_ppo_reference_plays_its_atari_pipeline_and_records_whole_games(tmp_path):
    """``analysis/atari_learning.py``'s sb3 side (``mpirl.bench.refs.sb3_atari``): SB3's PPO with the Zoo's Atari
    settings on Breakout for two rollouts of 8 games x 128 steps; every whole game (5 lives) its Monitor saw is a row
    (seconds since training began, length in agent steps, unclipped score), and its counts come last on stdout."""
    import json
    pytest.importorskip("cv2")
    out = tmp_path / "episodes.txt"
    proc = subprocess.run([sys.executable, "-m", "mpirl.bench.refs.sb3_atari", "1", "2048", "600",
                           "ALE/Breakout-v5", str(out)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["env_steps_sampled"] == 2048 and counts["seconds"] > 0
    rows = np.loadtxt(out, ndmin=2)
    assert counts["episodes"] == len(rows) >= 1, rows
    assert (np.diff(rows[:, 0]) >= 0).all() and (rows[:, 0] >= 0).all()
    # a game of 5 lives lasts more than 30 agent steps, and at most a game's 256 steps plus its frames outside
    # them (up to 30 no-ops at the start, FIRE after each life) / 4; a score is whole bricks
    assert (rows[:, 1] > 30).all() and (rows[:, 1] <= 2048 / 8 + 20).all(), rows
    assert (rows[:, 2] >= 0).all() and np.array_equal(rows[:, 2], np.round(rows[:, 2]))
