"""Reference libraries that cannot share the project's venv, each in a venv of its own, made on first use and kept.

RLlib 2.60 pins ``gymnasium==1.2.2`` and Sample Factory 2.1.1 ``numpy < 2`` and ``gymnasium < 1.0``; the project
runs on numpy 2 and Gymnasium 1.4 (``Taxi-v4`` is 1.4's). Installing either beside mpirl would downgrade what mpirl
runs on, so a benchmark that compares against them runs them in their own venv, as a user of that library would:
``python -m venv`` plus ``pip install`` of the pinned packages below (torch pinned to the CPU build the README's
command installs). A venv lives under ``$MPIRL_BENCH_VENVS`` (default ``~/.cache/mpirl/bench-venvs``), named by
its packages, so a change of pins makes a new one; it is marked ready only after pip succeeded, so a venv whose
install was cut off is made again. Two benchmarks wanting the same venv at once wait for each other (a file lock).
Each takes about 40 s to make here and 1.4–1.7 GB of disk (torch in each); delete the folder to reclaim it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

TORCH = "torch==2.13.0"
MINATAR = "minatar==1.0.15"  # MinAtar Breakout for the IMPALA bench's throughput rows (the project's minatar extra)
ALE = "ale-py==0.12.1"  # Atari 2600 games with their ROMs bundled, for the Atari bench (as the project's venv has)
OPENCV = "opencv-python-headless==4.13.0.92"  # RLlib's Atari wrappers resize and grayscale with it (not a dependency)
VENVS: dict[str, tuple[str, ...]] = {
    # RLlib's new API stack (PPO, APPO, IMPALA) on torch.
    "rllib": ("ray[rllib]==2.60.0", TORCH, MINATAR, ALE, OPENCV),
    # Sample Factory's APPO.
    "sample-factory": ("sample-factory==2.1.1", TORCH, "numpy<2", "gymnasium<1.0", MINATAR, ALE),
}
READY = "mpirl-ready"


def root() -> Path:
    return Path(os.environ.get("MPIRL_BENCH_VENVS") or Path.home() / ".cache" / "mpirl" / "bench-venvs")


def venv_dir(name: str) -> Path:
    packages = VENVS[name]
    tag = hashlib.sha256(" ".join(packages).encode()).hexdigest()[:10]
    return root() / f"{name}-{tag}"


def python_of(name: str, log=print) -> Path:
    """The Python of the reference venv ``name`` (a key of :data:`VENVS`), made first if it is not there yet."""
    where = venv_dir(name)
    python = where / "bin" / "python"
    if (where / READY).exists():
        return python
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f"{where.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (where / READY).exists():  # made by another process while this one waited
            return python
        shutil.rmtree(where, ignore_errors=True)  # a venv whose install was cut off
        log(f"making the {name} reference venv in {where} (once): pip install {' '.join(VENVS[name])}")
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
        proc = subprocess.run([str(python), "-m", "pip", "install", "-q", *VENVS[name]], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"pip could not make the {name} reference venv in {where} "
                               f"(exit {proc.returncode}): {proc.stderr[-2000:]}")
        (where / READY).write_text(" ".join(VENVS[name]) + "\n")
    return python
