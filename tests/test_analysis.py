"""The analysis scripts read real runs: study table and figures, solve table, curves."""

import subprocess
import sys

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
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_study_table_and_figures(pair):
    proc = script("analysis/study.py", "--runs", str(pair))
    assert proc.returncode == 0, proc.stderr
    table = (pair / "table.txt").read_text()
    for label in ("loss, converged half", "transferred priority", "sampled priority", "generated / consumed",
                  "learner comm %", "actor experiences/s", "learner experiences/s", "link bytes / trained exp"):
        line = next(l for l in table.splitlines() if label in l)
        proposed, baseline, ratio = (float(x) for x in line.split()[-3:])
        assert proposed > 0 and baseline > 0 and ratio == pytest.approx(proposed / baseline, rel=1e-2)
    assert (pair / "link-none-base.png").stat().st_size > 10_000


def test_solve_table_and_curves_read_the_runs(pair):
    proc = script("analysis/solve_table.py", "--runs", str(pair / "link-none-base"))
    assert proc.returncode == 0, proc.stderr
    assert "proposed" in proc.stdout and "baseline" in proc.stdout
    run_dir = next((pair / "link-none-base").glob("*/run.h5")).parent
    proc = script("analysis/curves.py", str(run_dir), "-o", str(pair / "c.png"))
    assert proc.returncode == 0 and (pair / "c.png").exists()


def test_random_play_level_and_runs_against_it(pair):
    runs = [str(p.parent) for p in (pair / "link-none-base").glob("*/run.h5")]
    proc = script("analysis/random_play.py", "jobs/cartpole.toml", "--episodes", "50", "--runs", *runs)
    assert proc.returncode == 0, proc.stderr
    level = float(proc.stdout.split("random play")[1].split()[1])
    assert 10 < level < 40  # CartPole-v1 under uniform random actions: about 22
    rows = [line for line in proc.stdout.splitlines() if line.strip().startswith("all actors")]
    assert len(rows) == len(runs) == 2
    for row in rows:
        z = float(row.split("z")[-1])
        assert z > 3  # 300 train steps already play CartPole far better than chance
