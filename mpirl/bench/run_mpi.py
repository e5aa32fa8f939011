"""Start a two-rank benchmark (``mpirl.bench.ranks``) under the venv's mpiexec and read its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from mpirl.launcher import find_mpiexec, launch_command, launch_env


def mpiexec_json(what: str, opts: dict, timeout: float) -> dict:
    """``mpiexec -n 2 python -m mpirl.bench.ranks what`` with a timeout; its result, or RuntimeError."""
    mpiexec = find_mpiexec()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        flags, env = launch_env(mpiexec)
        cmd = [mpiexec, "-n", "2", *flags, sys.executable, "-m", "mpirl.bench.ranks", what, str(out), json.dumps(opts)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"benchmark {what!r} did not finish within {timeout:.0f} s: {' '.join(cmd)}") from None
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"benchmark {what!r} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def run_job(n: int, job: str, sets: list[str], out: Path, name: str, timeout: float, what: str) -> Path:
    """``mpirl run`` of ``job`` on ``n`` ranks under the venv's mpiexec, its runs under ``out`` named ``name``;
    the run directory it made, or RuntimeError naming ``what`` bench it was for."""
    cmd, env = launch_command(find_mpiexec(), n, str(job), [*sets, f'run.out_dir="{out}"', f'run.name="{name}"'], [])
    cmd.append("--quiet")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} bench job did not finish in {timeout:.0f} s: {' '.join(cmd)}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{what} bench job failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return sorted(Path(out).glob(f"{name}-*/run.h5"), key=lambda p: p.stat().st_mtime)[-1].parent
