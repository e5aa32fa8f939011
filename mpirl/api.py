"""What a user scripts, in three calls (also as ``mpirl.load_policy``, ``mpirl.read_run``, ``mpirl.launch``)::

    run_dir = mpirl.launch("jobs/cartpole.toml", **{"run.seed": 2})     # a job on local ranks; its run directory
    policy = mpirl.load_policy(run_dir)                                  # its trained policy
    actions, state = policy.act(observations)                            # a batch (or one) of observations
    tables = mpirl.read_run(run_dir)                                     # every rank's tables, as DataFrames

No MPI in this process: :func:`launch` runs ``mpirl launch`` as a child, the others read the run's files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mpirl.agents.trained_policy import TrainedPolicy


class JobFailed(RuntimeError):
    """``mpirl launch`` ended with a non-zero exit code: ``code``, the ``run_dir`` if one was made (a preempted run,
    code 75, can be resumed from it), and the last lines it printed (``said``)."""

    def __init__(self, code: int, run_dir: Path | None, said: str):
        self.code, self.run_dir, self.said = code, run_dir, said
        super().__init__(f"mpirl launch exited with code {code}" + (f" (run directory {run_dir})" if run_dir else "")
                         + (f": {said}" if said else ""))


def load_policy(run_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None,
                device: str = "cpu") -> TrainedPolicy:
    """The trained policy of a run (or of the newest run in a directory of runs) from ``checkpoint`` (default: the
    newest). ``policy.act(obs, state=None, episode_start=None, deterministic=True)`` returns ``(actions, state)``;
    ``policy.source`` says which checkpoint. Raises :class:`mpirl.config.ConfigError` naming what to pass instead."""
    from mpirl.trained.runs import load_trained
    return load_trained(run_dir, checkpoint, device)[0]


@dataclass
class Run:
    """A run's files as tables: ``tables[file][table]`` (``tables["learner"]["learner"]``, ``tables["buffer_1"]
    ["actors"]``, ...) as pandas DataFrames (numpy column dicts without pandas); ``job``, the job's flat settings;
    ``attrs``, run.h5's (``status``, ``start_time``, ...); ``notes``, what could not be read."""
    run_dir: Path
    job: dict[str, Any]
    attrs: dict[str, Any]
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def read_run(run_dir: str | os.PathLike) -> Run:
    """Every rank file's tables of a run (finished, running or killed: the files are read, never locked): ``run_dir``
    itself, or the newest run below it, as :func:`load_policy` takes it. Raises :class:`mpirl.config.ConfigError` naming
    ``RUN_DIR`` when there is no run there."""
    from mpirl.metrics.run_file import load_run, newest_run
    run_dir = newest_run(run_dir)
    loaded = load_run(run_dir)
    try:
        import pandas as pd
        frame: Any = pd.DataFrame
    except ImportError:
        frame = dict
    run = loaded["run"]
    out = Run(run_dir, dict(run["job"]), dict(run["attrs"]))
    if run["note"] not in ("", "ok"):
        out.notes["run"] = run["note"]
    for name, entry in loaded["files"].items():
        out.tables[name] = {table: frame(dict(cols)) for table, cols in entry["tables"].items()}
        if entry["note"] not in ("", "ok"):
            out.notes[name] = entry["note"]
    return out


def launch(job: str | os.PathLike, n: int | None = None, resume: str | None = None, quiet: bool = False,
           **overrides: Any) -> Path:
    """Run ``job`` with ``mpirl launch`` (``-n n`` ranks; default: what the job needs) and return its run directory.
    ``overrides``: job fields by their dotted keys, ``**{"replay.architecture": "baseline"}`` (or ``section__key``:
    ``replay__architecture="baseline"``). ``quiet``: keep the job's output from this process's stdout. Raises
    :class:`JobFailed` when the job does not complete (bad input: code 2; preempted: 75)."""
    cmd = [sys.executable, "-m", "mpirl", "launch", os.fspath(job)]
    if n is not None:
        cmd += ["-n", str(int(n))]
    if resume is not None:
        cmd += ["--resume", str(resume)]
    for key, value in overrides.items():
        cmd += ["--set", f"{key.replace('__', '.')}={_toml(value)}"]
    run_dir: Path | None = None
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not quiet:
                print(line, end="", flush=True)
            if line.startswith("mpirl: run directory "):
                run_dir = Path(line[len("mpirl: run directory "):].strip())
            tail = (tail + [line.rstrip()])[-5:]
        code = proc.wait()
    if code != 0 or run_dir is None:
        errors = [t for t in tail if "error" in t]
        raise JobFailed(code, run_dir, (errors or tail or [""])[-1])
    return run_dir


def _toml(value: Any) -> str:
    """A Python value as the TOML value ``--set`` reads."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, float) and value != value:
        return "nan"
    return repr(value)
