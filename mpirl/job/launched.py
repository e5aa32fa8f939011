"""A job started by ``mpirl launch``: where its refusal goes and the line it opens with.

``mpirl launch`` reads the job file and the command line itself (bad fields, ``-n``, ``--resume``: refused
before anything starts), then starts ``mpiexec`` and leaves the rest of the checks to the job, as under a plain
``mpiexec`` or ``srun``: rank 0 checks the job once (the environment, the network's size, each role's memory)
and every other rank takes its result (:func:`mpirl.job.wiring.run_job`), and the ranks of each node check their
memory together. The launcher would only repeat those checks, with torch imported for them, on cores the ranks'
own imports already fill (``mpirl bench startup``).

What the launcher adds, through the environment of the job (:func:`environment`): a refusal the ranks find
reaches the user as the launcher's own would have: rank 0 writes its one line to the file :data:`REFUSAL` names
(under a temporary name, then renamed), every rank leaves with exit 0 (so ``mpiexec`` adds no report of failed
processes), and the launcher prints the line and exits 2 (:func:`refusal`). Once the checks passed, rank 0
prints the launcher's ``mpiexec`` command (:data:`COMMAND`) as the job's first line. Without them (a plain
``mpiexec`` or ``srun``) rank 0 prints a refusal itself and every rank exits 2.
"""

from __future__ import annotations

import os
from pathlib import Path

REFUSAL = "MPIRL_REFUSAL"  # the file rank 0 of a launched job writes a refusal to
COMMAND = "MPIRL_COMMAND"  # the mpiexec command the launcher ran, for rank 0 to print once the checks passed


def environment(refusal: Path, command: list[str]) -> dict[str, str]:
    """What the launcher adds to the job's environment."""
    return {REFUSAL: str(refusal), COMMAND: " ".join(command)}


def refuse(message: str) -> bool:
    """On rank 0: hand ``message`` to the launcher; False when no launcher asked for it (print it yourself)."""
    where = os.environ.get(REFUSAL, "")
    if not where:
        return False
    path = Path(where)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(message)
    os.replace(tmp, path)
    return True


def under_launcher() -> bool:
    return bool(os.environ.get(REFUSAL))


def command() -> str:
    """The launcher's ``mpiexec`` command line, '' without a launcher."""
    return os.environ.get(COMMAND, "")


def refusal(path: Path) -> str:
    """On the launcher, once the job ended: the refusal its rank 0 wrote, '' if none."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
