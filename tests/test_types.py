"""The algorithm contract is checked, not hoped for: mypy holds every folder of mpirl/algos/ (through the registry
in mpirl/registry.py) and the shared loops to the types of mpirl/job/contract.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One mypy cache for the module's runs, made empty: what the second run shares with the first is the
    libraries' own modules (numpy's, torch's stubs: most of a run's time), read the same from the same files; the
    package's modules are checked again wherever they changed, as mypy's incremental mode does."""
    where = tmp_path_factory.mktemp("mypy-cache")
    yield where
    shutil.rmtree(where, ignore_errors=True)


def mypy(cache: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_every_algorithm_and_the_shared_roles_type_check_against_the_contract(cache):
    out = mypy(cache)  # the files and settings of setup.cfg's [mypy]
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success" in out.stdout


def test_an_algorithm_that_breaks_the_contract_is_caught(tmp_path, cache):
    """A copy of the package whose Ape-X info module lost its watch frame, and whose DistQL layout returns the
    wrong type: the checker names both."""
    pkg = tmp_path / "mpirl"
    shutil.copytree(ROOT / "mpirl", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")
    info = pkg / "algos" / "apex" / "info.py"
    info.write_text(info.read_text().replace("from mpirl.metrics.watch import frame\n", "")
                    .replace('"frame", ', ""))
    algorithm = pkg / "algos" / "distql" / "algorithm.py"
    text = algorithm.read_text()
    assert "def layout(cfg: JobConfig, world_size: int) -> Layout:" in text
    algorithm.write_text(text.replace("def layout(cfg: JobConfig, world_size: int) -> Layout:",
                                      "def layout(cfg: JobConfig, world_size: int) -> dict:"))
    out = mypy(cache, cwd=tmp_path)
    assert out.returncode == 1, out.stdout
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if 'expected "Info"' in line)  # the registry's apex line
    assert "missing" in lines[at + 1] and "frame" in lines[at + 2], out.stdout
    assert 'Module "mpirl.algos.distql.algorithm"' in out.stdout and "layout" in out.stdout, out.stdout
