"""``mpirl compare`` (mpirl/metrics/compare.py) on small run directories written with the project's own writer, shaped
like an Ape-X run (learner.h5's train and batches, buffer_1.h5's episodes and actors) and an A3C run (updates.h5,
worker_<rank>.h5's episodes and rollouts): grouping, the IQM and its bootstrap interval by hand, the PNG, bad input.
No MPI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpirl import cli
from mpirl.job.checkpoint import MAY_CHANGE, MAY_CHANGE_SECTIONS
from mpirl.metrics import compare as cmp
from mpirl.metrics.run_file import create_run_file, finish_run_file, link_rank_files
from mpirl.metrics.writer import MetricsFile

from conftest import bad_targets, tree

ROOT = Path(__file__).resolve().parents[1]
F8, I8 = np.float64, np.int64
WINDOW, LENGTH = 20, 10  # run.return_window; every episode's length


def job(algorithm: str, seed: int, **more) -> dict:
    """A flat job as run.h5 holds it; what a resumed job may change differs from seed to seed (to be ignored)."""
    return {"agent.algorithm": algorithm, "env.id": "CartPole-v1", "run.seed": seed, "run.name": f"s{seed}",
            "run.out_dir": "/elsewhere", "run.return_window": WINDOW, "run.wall_seconds": 60.0 * seed,
            "log.interval": 0.5 * seed, "agent.device": "cpu" if seed % 2 else "auto", "agent.hidden": [64, 64],
            "run.target_return": float("nan"), **more}


def episode_rows(n: int, offset: float, actors: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Episode k ends at 0.1 (k + 1) s, played by actor k % len(actors), returns offset + k; each actor's env steps
    count LENGTH per episode of its own."""
    k = np.arange(n)
    actor = np.asarray(actors)[k % len(actors)]
    steps = LENGTH * (k // len(actors) + 1)
    return {"time": 0.1 * (k + 1), "actor": actor, "env_steps": steps, "return": offset + k,
            "length": np.full(n, LENGTH)}


def apex_run(root: Path, seed: int, arch: str = "proposed", episodes: int = 60, offset: float = 0.0) -> Path:
    run_dir = root / f"{arch}-s{seed}"
    create_run_file(run_dir, "", job("apex", seed, **{"replay.architecture": arch}), {"world_size": 4})
    rows = episode_rows(episodes, offset, (2, 3))
    with MetricsFile(run_dir / "buffer_1.h5", {"role": "buffer", "rank": 1}) as mf:
        mf.table("episodes", {"time": F8, "actor": I8, "env_steps": I8, "return": F8, "length": I8}).extend(**rows)
        mf.table("actors", {"time": F8, "actor": I8, "env_steps": I8}).extend(
            time=rows["time"], actor=rows["actor"], env_steps=rows["env_steps"])
    t = np.arange(1, 7, dtype=float)
    with MetricsFile(run_dir / "learner.h5", {"role": "learner", "rank": 0}) as mf:
        mf.table("train", {"time": F8, "train_steps": I8, "env_steps": I8, "loss": F8}).extend(
            time=t, train_steps=100 * t, env_steps=0 * t, loss=1.0 / t + seed)
        mf.table("batches", {"train_step": I8, "loss": F8}).extend(train_step=np.arange(1, 601),
                                                                    loss=np.full(600, float(seed)))
    link_rank_files(run_dir, {"learner": "learner.h5", "buffer_1": "buffer_1.h5"})
    finish_run_file(run_dir, "completed")
    return run_dir


def a3c_run(root: Path, seed: int, episodes: int = 40) -> Path:
    run_dir = root / f"a3c-s{seed}"
    create_run_file(run_dir, "", job("a3c", seed), {"world_size": 3})
    t = np.arange(1, 11, dtype=float)
    with MetricsFile(run_dir / "updates.h5", {"role": "server", "rank": 0}) as mf:
        mf.table("updates", {"time": F8, "version": I8, "env_steps": I8, "loss": F8, "worker": I8}).extend(
            time=t, version=7 * t, env_steps=0 * t, loss=t, worker=np.ones(10))
    for w in (1, 2):
        rows = episode_rows(episodes, 100.0, (w,))
        with MetricsFile(run_dir / f"worker_{w}.h5", {"role": "worker", "rank": w}) as mf:
            mf.table("episodes", {"time": F8, "episode": I8, "return": F8, "length": I8}).extend(
                time=rows["time"], episode=np.arange(episodes), **{"return": rows["return"]}, length=rows["length"])
            mf.table("rollouts", {"time": F8, "env_steps": I8}).extend(time=rows["time"], env_steps=rows["env_steps"])
    link_rank_files(run_dir, {"updates": "updates.h5", "worker_1": "worker_1.h5", "worker_2": "worker_2.h5"})
    finish_run_file(run_dir, "completed")
    return run_dir


def final_return(episodes: int, offset: float) -> float:
    """The mean of the last WINDOW returns offset + k, k < episodes."""
    return offset + (episodes - 1) - (WINDOW - 1) / 2


def run_compare(tmp_path: Path, *paths, **kw) -> cmp.Comparison:
    return cmp.compare(paths, out=tmp_path / "out.png", ignore=(*cmp.SEED_KEYS, *MAY_CHANGE),
                       ignore_sections=MAY_CHANGE_SECTIONS, **kw)


def mpirl(capsys, *args) -> tuple[int, str, str]:
    code = cli.main(["compare", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *args) -> str:
    """The one line a refused comparison prints (exit 2)."""
    code, out, err = mpirl(capsys, *args)
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("mpirl: error: "), err
    return err


@pytest.fixture
def six(tmp_path) -> Path:
    """3 seeds x 2 placements; each seed's runs play a different number of episodes (runs of different length)."""
    root = tmp_path / "runs"
    for seed in (1, 2, 3):
        for arch, offset in (("proposed", 10.0 * seed), ("baseline", -5.0 * seed)):
            apex_run(root, seed, arch, episodes=40 + 10 * seed, offset=offset)
    return root


def test_three_seeds_of_two_settings_make_two_groups_of_three_named_by_the_setting(six, tmp_path, capsys):
    import matplotlib.image
    done = run_compare(tmp_path, six)
    assert [g.label for g in done.groups] == ["replay.architecture=baseline", "replay.architecture=proposed"]
    for g, sign in zip(done.groups, (-5.0, 10.0)):
        assert [r.seed for r in g.runs] == ["1", "2", "3"]
        assert [r.final for r in g.runs] == pytest.approx([final_return(40 + 10 * s, sign * s) for s in (1, 2, 3)])
        grid, q25, median, q75 = g.band()
        assert grid[-1] == pytest.approx(min(r.x[-1] for r in g.runs))  # cut to the shortest run
        assert np.all(q25 <= median) and np.all(median <= q75)
    proposed = done.groups[1].runs[0]
    assert proposed.x[-1] == pytest.approx(LENGTH * 50)  # env steps summed over both actors at the last episode
    assert done.notes == [] and "n // 4" in done.table and "fewer than 4 runs" in done.table
    image = matplotlib.image.imread(done.out)
    assert image.size > 0 and image.shape[0] > 100
    code, out, err = mpirl(capsys, six, "--out", tmp_path / "cli.png", "--x", "time")
    assert code == 0 and "replay.architecture=proposed  3" in out and (tmp_path / "cli.png").stat().st_size > 0


def test_iqm_and_its_bootstrap_interval_by_hand(six, tmp_path):
    assert cmp.iqm([1, 2, 3, 100]) == 2.5  # 4 runs: one cut at each end
    assert cmp.iqm([50, 1, 2, 3, 4]) == 3.0  # 5: one cut at each end, the middle three
    assert cmp.iqm(range(8)) == 3.5  # 8: two cut at each end
    assert cmp.iqm([3, 1, 2]) == 2.0  # fewer than 4: none cut, the mean
    values = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    draws = np.random.default_rng(3).integers(0, 5, size=(cmp.RESAMPLES, 5))
    by_hand = [sum(sorted(values[i] for i in row)[1:4]) / 3 for row in draws]
    assert cmp.iqm_interval(values, seed=3) == pytest.approx(tuple(np.percentile(by_hand, [2.5, 97.5])))
    assert cmp.iqm_interval([7.0, 7.0, 7.0], seed=0) == (7.0, 7.0)
    done = run_compare(tmp_path, six, seed=3)
    finals = [final_return(40 + 10 * s, 10.0 * s) for s in (1, 2, 3)]
    lo, hi = cmp.iqm_interval(finals, seed=3)
    row = next(line for line in done.table.splitlines() if line.startswith("replay.architecture=proposed"))
    assert f"{np.mean(finals):.4g}" in row and f"[{lo:.4g}, {hi:.4g}]" in row and min(finals) <= lo <= hi <= max(finals)


def test_columns_and_axes_of_two_families(tmp_path, capsys):
    root = tmp_path / "runs"
    apex_run(root, 1)
    a3c = a3c_run(root, 1)
    done = run_compare(tmp_path, root)  # the return of both families: grouped by their algorithm
    assert [g.label for g in done.groups] == ["agent.algorithm=a3c", "agent.algorithm=apex"]
    assert done.groups[0].runs[0].x[-1] == pytest.approx(2 * LENGTH * 40)  # both workers' rollouts
    done = run_compare(tmp_path, a3c, x="train_steps", force=True)
    assert done.groups[0].label == "CartPole-v1 a3c" and done.groups[0].runs[0].x[-1] == pytest.approx(28)
    done = run_compare(tmp_path, root / "proposed-s1", y="learner.loss", x="train_steps", force=True)
    assert done.groups[0].runs[0].x[-1] == 600 and done.groups[0].runs[0].final == pytest.approx(1 / 6 + 1)
    done = run_compare(tmp_path, root / "proposed-s1", y="batches.loss", force=True)  # rows by train step
    assert done.groups[0].runs[0].final == 1.0
    err = refused(capsys, root, "--y", "learner.loss", "--out", tmp_path / "x.png")
    assert "not in 1 of the 2 runs" in err and "a3c-s1" in err
    err = refused(capsys, root / "proposed-s1", "--y", "loss.nothing", "--out", tmp_path / "x.png")
    assert "learner.train: env_steps, loss, train_steps" in err
    (a3c / "updates.h5").unlink()  # no parameter server's file: no train-step counter
    assert "no train steps counter" in refused(capsys, a3c, "--x", "train_steps", "--out", tmp_path / "x.png")


def test_bad_input_is_one_line_and_exit_2_and_runs_without_returns_are_skipped(six, tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").mkdir()
    assert "holds no run.h5" in refused(capsys, tmp_path / "empty")
    assert "does not exist" in refused(capsys, tmp_path / "nowhere")
    out = tmp_path / "outs"
    out.mkdir()
    for path, extra, says in bad_targets(out, ".png"):
        before = tree(out)
        assert says in refused(capsys, six, "--out", path, *extra), (path, extra)
        assert tree(out) == before, path  # nothing written, nothing left behind
    assert "--force" in refused(capsys, six, "--out", out / "there.png")
    assert mpirl(capsys, six, "--out", out / "there.png", "--force")[0] == 0
    young = apex_run(tmp_path / "young", 1, episodes=WINDOW - 1)
    broken = tmp_path / "young" / "broken"
    broken.mkdir()
    (broken / "run.h5").write_bytes(b"not HDF5")
    code, out, err = mpirl(capsys, six, tmp_path / "young", "--out", tmp_path / "a.png")
    assert code == 0 and err.count("mpirl: note: ") == 2 and "19 episode(s) so far" in err and str(broken) in err
    assert "no run to compare" in refused(capsys, young, "--out", tmp_path / "b.png")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert "pip install 'mpirl[analysis]'" in refused(capsys, six, "--out", tmp_path / "c.png")


def test_the_analysis_script_is_the_command(six, tmp_path):
    out = subprocess.run([sys.executable, "analysis/compare.py", str(six), "--out", str(tmp_path / "s.png")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "replay.architecture=baseline" in out.stdout and (tmp_path / "s.png").stat().st_size > 0
