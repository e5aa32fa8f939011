"""The numerical tests hold whichever kernels MKL picks, so the suite is green on any x86-64 CPU.

torch's CPU build does its matrix products in MKL, which picks its kernels by CPU (AVX-512 on an Intel Xeon, AVX2 on
most AMD machines); the same test gives float32 results that differ in their last bits from one CPU to another, and an
assertion tuned on one machine can fail on the next (issue 58: K learners against one, 9.2e-5 on an AVX-512 Xeon, 3e-8
on AVX2). ``MKL_CBWR`` makes MKL take one branch of its kernels whatever the CPU: ``COMPATIBLE`` (the kernels every
x86-64 CPU runs; it reproduced the Xeon's failure) and ``AVX2``. This module runs every test marked ``numerical``
again under each, in a pytest of its own (the machine's own branch is the suite's run).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import ROOT, mpi_env

AT_LEAST = 100  # numerical tests there are (122 when this was written): a marker lost would show as fewer


def marked() -> list[str]:
    """The test files that mark tests ``numerical`` (read as text: collecting every module imports them all)."""
    here = ROOT / "tests"
    return sorted(str(p.relative_to(ROOT)) for p in here.glob("test_*.py")
                  if "mark.numerical" in p.read_text() and p.name != "test_cpu_kernels.py")


@pytest.mark.mpi  # the K-learner comparisons run mpiexec
@pytest.mark.parametrize("branch", ["COMPATIBLE", "AVX2"])
def test_the_numerical_tests_hold_under_each_of_mkls_kernel_branches(branch):
    env = {**mpi_env(), "MKL_CBWR": branch}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "numerical",
                           "-o", "addopts=", *marked()], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=1200)
    assert proc.returncode == 0, f"MKL_CBWR={branch}:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= AT_LEAST, proc.stdout[-3000:]
