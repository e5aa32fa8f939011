"""A launched job's refusal goes to its launcher (mpirl/job/launched.py), and the phase marks (mpirl/phases.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from mpirl.job import launched

from conftest import ROOT, mpi_command, mpi_env, run_cli


def test_without_a_launcher_rank_0_says_it_itself(monkeypatch):
    monkeypatch.delenv(launched.REFUSAL, raising=False)
    monkeypatch.delenv(launched.COMMAND, raising=False)
    assert not launched.refuse("x: bad") and not launched.under_launcher() and launched.command() == ""


def test_a_refusal_is_written_whole_for_the_launcher(tmp_path, monkeypatch):
    path = tmp_path / "refusal"
    assert launched.refusal(path) == ""
    monkeypatch.setenv(launched.REFUSAL, str(path))
    assert launched.refuse("replay.capacity: too big; lower it") and launched.under_launcher()
    assert launched.refusal(path) == "replay.capacity: too big; lower it"
    assert not list(tmp_path.glob("*.part"))  # written under a temporary name, then renamed
    assert launched.environment(path, ["mpiexec", "-n", "4"]) == {launched.REFUSAL: str(path),
                                                                 launched.COMMAND: "mpiexec -n 4"}


@pytest.mark.mpi
def test_a_refusal_inside_a_launched_job_is_one_line_from_the_launcher_and_nothing_else(tmp_path):
    """The ranks find the refusal (rank 0's check), hand it over and leave with 0, so Open MPI adds no report of
    failed processes; the launcher prints the one line and exits 2; the same job under a plain mpiexec says the
    same line from rank 0 and exits 2."""
    sets = ["--set", f'run.out_dir="{tmp_path}"', "--set", "agent.hidden=[200000, 200000]"]
    proc = run_cli("launch", str(ROOT / "jobs" / "cartpole.toml"), *sets, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpirl: error: agent.hidden: the job needs about "), lines
    plain = subprocess.run(mpi_command(4, tmp_path, "agent.hidden=[200000, 200000]"), capture_output=True,
                           text=True, env=mpi_env(), cwd=ROOT, timeout=300)
    assert plain.returncode == 2
    errors = [line for line in (plain.stdout + plain.stderr).splitlines() if line.startswith("mpirl: error:")]
    available = re.compile(r"[0-9.]+ GiB are available")  # the node's, read a moment apart
    assert [available.sub("", e) for e in errors] == [available.sub("", e) for e in lines], errors
    assert not any(tmp_path.iterdir())


def test_phase_marks_are_off_unless_asked_for_and_name_each_process(tmp_path):
    marks = tmp_path / "marks.txt"
    code = "from mpirl import phases; phases.mark('one'); phases.mark('two')"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60,
                   env={k: v for k, v in os.environ.items() if k != "MPIRL_PHASES"})
    assert not marks.exists()
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "MPIRL_PHASES": str(marks),
                                                                         "OMPI_COMM_WORLD_RANK": "3"})
    assert proc.wait(60) == 0
    from mpirl import phases
    got = phases.read(marks)
    assert [m.phase for m in got] == ["process", "one", "two"]
    assert {m.pid for m in got} == {proc.pid} and {m.rank for m in got} == {"3"}
    assert got[0].time <= got[1].time <= got[2].time and got[2].cpu >= got[1].cpu >= 0


def test_an_mpiexec_that_is_not_there_is_one_line_naming_the_option(tmp_path, capsys):
    from mpirl import cli
    (tmp_path / "mpiexec").write_text("not a program")  # there, but not executable
    for given in (str(tmp_path / "nowhere" / "mpiexec"), str(tmp_path / "mpiexec"), "no-such-mpiexec"):
        code = cli.main(["launch", str(ROOT / "jobs" / "cartpole.toml"), "--mpiexec", given,
                         "--set", f'run.out_dir="{tmp_path / "runs"}"'])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("mpirl: error: --mpiexec: "), err
    assert not (tmp_path / "runs").exists()
