"""Every config field has a declared domain; every way out of it is exit 2 with one line naming the field.

The bad values are generated from the declarations (``mpirl.domain.outside``), so a field added
later is walked too. The command line is run in-process here (fast); tests/test_mpi_runs.py and
the cases at the end check the same refusal through ``mpirl launch`` and ``mpiexec mpirl run``.
"""

from __future__ import annotations

import json
import math
import pickle

import pytest

from mpirl import cli, config
from mpirl.domain import outside

from conftest import JOBS, run_cli, mpi_command, mpi_env, ROOT

JOB = str(JOBS / "cartpole.toml")


def toml(value) -> str:
    """``value`` as a TOML literal for ``--set``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: \\u0000, \\n escapes
    return "[" + ", ".join(toml(v) for v in value) + "]"


CASES = [(key, bad) for key, kind, dom, _ in config.fields_with_domains() for bad in outside(kind, dom)]


def test_every_field_declares_a_domain_and_its_default_is_inside():
    from mpirl.domain import problem
    fields = list(config.fields_with_domains())
    assert len(fields) >= 60
    for key, kind, dom, default in fields:
        assert problem(default, kind, dom) == "", key


@pytest.mark.parametrize("key, bad", CASES, ids=[f"{k}={b!r}"[:60] for k, b in CASES])
def test_out_of_domain_value_is_exit_2_with_one_line_naming_the_field(key, bad, capsys):
    rc = cli.main(["validate", JOB, "--set", f"{key}={toml(bad)}"])
    out, err = capsys.readouterr()
    assert rc == 2, f"{key}={bad!r} was accepted: {out}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mpirl: error: {key}: must be "), err


def test_a_config_error_survives_pickling():
    err = pickle.loads(pickle.dumps(config.ConfigError("run.out_dir", "cannot create it")))
    assert isinstance(err, config.ConfigError) and err.key == "run.out_dir"
    assert str(err) == "run.out_dir: cannot create it"


@pytest.mark.parametrize("content", [b"\x00\x01\xff\xfe binary", "[run]\nname = 'caf\xe9'\n".encode("latin-1")])
def test_a_job_file_that_is_not_utf8_is_exit_2(tmp_path, content, capsys):
    job = tmp_path / "job.toml"
    job.write_bytes(content)
    assert cli.main(["validate", str(job)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not UTF-8 text" in err[0]


@pytest.mark.parametrize("n", ["0", "-3"])
def test_ranks_must_be_positive(n, capsys):
    assert cli.main(["validate", JOB, "-n", n]) == 2
    assert "-n: the number of ranks must be >= 1" in capsys.readouterr().err


def test_watch_interval_must_be_a_finite_positive_number(tmp_path, capsys):
    (tmp_path / "run.h5").write_bytes(b"")
    assert cli.main(["watch", str(tmp_path), "--interval", "nan"]) == 2
    assert "--interval" in capsys.readouterr().err
