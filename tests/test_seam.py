"""The algorithm seam: every folder of mpirl/algos/ offers the same interface, the shared wiring never names an
algorithm, and a job imports only its own algorithm (the shared wiring imports no torch)."""

from __future__ import annotations

import dataclasses
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpirl import config

PKG = Path(config.__file__).resolve().parent


@pytest.mark.parametrize("name", config.ALGORITHMS)
def test_every_algorithm_offers_the_interface(name):
    settings = importlib.import_module(f"mpirl.algos.{name}.settings")
    assert isinstance(settings.SECTIONS, dict) and callable(settings.check)
    for section, keys in settings.USES.items():  # every key it claims to read exists in that shared section
        fields = {f.name for f in dataclasses.fields(config.SHARED[section])}
        assert set(keys) <= fields, (name, section, set(keys) - fields)
    algo = importlib.import_module(f"mpirl.algos.{name}.algorithm")
    assert callable(settings.world_size)
    for attr in ("check", "layout", "build_topology", "rank_files", "role_map", "describe", "summary"):
        assert callable(getattr(algo, attr)), (name, attr)
    assert set(algo.ROLES) and all(callable(loop) for loop in algo.ROLES.values())
    info = importlib.import_module(f"mpirl.algos.{name}.info")
    assert callable(info.summarize) and callable(info.format_summary) and callable(info.frame)


def test_the_shared_wiring_never_names_an_algorithm():
    paths = sorted([*(PKG / "job").glob("*.py"), *(PKG / "actor_learner").glob("*.py")])
    assert len(paths) > 20
    for path in paths:
        text = path.read_text()
        for name in config.ALGORITHMS:
            assert not re.search(rf"\b{name}\b", text), f"{path.name} names the algorithm {name!r}"
    for name in ("config.py", "sections.py", "replay_job.py"):  # "apex" only as agent.algorithm's default
        assert "apex" not in (PKG / name).read_text().replace('"apex"', ""), name


def test_the_shared_wiring_imports_no_algorithm_and_no_torch():
    code = ("import sys; import mpirl.config, mpirl.algos, mpirl.job.wiring, mpirl.job.checks, "
            "mpirl.job.checkpoint, mpirl.metrics.summary, mpirl.cli; "
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'pettingzoo', 'mpirl.algos.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = eval(out.stdout)  # noqa: S307 - our own printout
    assert all(m.endswith(".settings") or m.split(".")[-1] in config.ALGORITHMS for m in loaded), loaded
    assert not [m for m in loaded if m.startswith(("torch", "pettingzoo"))], loaded


def test_a_job_sets_only_keys_its_algorithm_reads():
    cfg = config.JobConfig()
    assert "apex.n_step" in cfg.flat() and "qmix.td_lambda" not in cfg.flat()
    cfg.agent.algorithm = "qmix"
    flat = cfg.flat()
    assert "qmix.td_lambda" in flat and "apex.n_step" not in flat and "replay.alpha" not in flat
    assert all(config.reads("qmix", key) for key in flat)
    cfg.agent.algorithm = "distql"
    flat = cfg.flat()  # DistQL reads its section, env.id, the run's name, seed, directory and stop conditions but
    # train steps, and the checkpoints' cadence but the train steps'
    assert {"distql.tau", "env.id", "run.seed", "run.out_dir", "run.wall_seconds", "checkpoint.keep"} <= set(flat)
    assert not {"topology.buffers", "run.train_steps", "checkpoint.every_steps", "replay.capacity"} & set(flat)


def test_no_algorithm_imports_another_algorithm_s_folder():
    for name in config.ALGORITHMS:
        others = [o for o in config.ALGORITHMS if o != name]
        for path in sorted((PKG / "algos" / name).glob("*.py")):
            for other in others:
                assert f"mpirl.algos.{other}" not in path.read_text(), f"algos/{name}/{path.name} imports algos/{other}"
