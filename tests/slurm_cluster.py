"""A real one-node Slurm cluster for the tests: munged, slurmctld and slurmd on this machine.

Debian's ``slurm-wlm``, ``munge``, ``libpmix2`` and ``libpmix-dev`` are installed
with apt when missing (root only). The cluster runs from a private ``slurm.conf`` (``SLURM_CONF``)
on free ports of its own, with its state under a temporary directory, so it never
touches a Slurm the machine already has. Over-subscription is allowed: a 4-rank
job runs on a 2-core node.

``start(work, nodes=1)`` returns a :class:`Cluster` or raises :class:`Unavailable`
with the reason (the tests then skip with it); ``Cluster.stop()`` ends every daemon
it started. With ``nodes=2`` two slurmd (n1, n2) run on this one machine, each on a
port and spool directory of its own: allocations span two nodes, though every rank
runs on the same host.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# libpmix-dev: Slurm's pmix plugin opens pmix2/lib/libpmix.so, a link only the -dev package ships
# (with libpmix2 alone `srun --mpi=pmix` fails: "can not load PMIx library").
PACKAGES = ("slurm-wlm", "munge", "libpmix2", "libpmix-dev")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Unavailable(RuntimeError):
    """Slurm cannot run here; the message says why."""


def _run(cmd: list[str], timeout: float = 60, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode:
        raise Unavailable(f"{' '.join(cmd)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return proc


def _install() -> None:
    if shutil.which("slurmctld") and shutil.which("munged") and _has_pmix():
        return
    if not shutil.which("apt-get"):
        raise Unavailable("Slurm is not installed and there is no apt-get to install " + ", ".join(PACKAGES))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    if _run(cmd, timeout=900, env=env, check=False).returncode:
        _run(["apt-get", "update", "-q"], timeout=600, env=env)
        _run(cmd, timeout=900, env=env)


def _has_pmix() -> bool:
    return any(Path("/usr/lib").glob("*/pmix2/lib/libpmix.so"))


def _start_munge() -> None:
    """munged as user munge, with a key, unless one is already answering (it is left running: shared)."""
    if _run(["munge", "-n"], check=False).returncode == 0:
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(os.urandom(1024))
    for path in (key.parent, Path("/var/lib/munge"), Path("/var/log/munge"), Path("/run/munge")):
        path.mkdir(parents=True, exist_ok=True)
        shutil.chown(path, "munge", "munge")
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    Path("/run/munge").chmod(0o755)
    _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"])
    deadline = time.monotonic() + 15
    while _run(["munge", "-n"], check=False).returncode and time.monotonic() < deadline:
        time.sleep(0.2)
    _run(["munge", "-n"])


def _node_lines(host: str, nodes: int) -> str:
    """One node named after the host, or ``nodes`` slurmd on this host (n1, n2, ...; a port each)."""
    if nodes == 1:
        return _node_line(host)
    line = _node_line(host)
    return "\n".join(line.replace(f"NodeName={host} ", f"NodeName=n{i} Port={_free_port()} ")
                     for i in range(1, nodes + 1))


def _node_line(host: str) -> str:
    out = _run(["slurmd", "-C"]).stdout.splitlines()
    line = next((x for x in out if x.startswith("NodeName=")), "")
    if not line:
        raise Unavailable(f"slurmd -C gave no node line: {out}")
    # keep what describes the hardware; memory a little under what slurmd found, so the node is never drained
    words = dict(w.split("=", 1) for w in line.split() if "=" in w)
    mem = max(int(int(words.get("RealMemory", "1024")) * 0.9), 256)
    keep = " ".join(f"{k}={words[k]}" for k in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket",
                                                  "ThreadsPerCore") if k in words)
    return f"NodeName={host} NodeAddr=127.0.0.1 {keep} RealMemory={mem} State=UNKNOWN"


@dataclass
class Cluster:
    work: Path
    conf: Path
    env: dict

    def run(self, *cmd: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        return _run(list(cmd), timeout=timeout, env=self.env, check=check)

    def job_state(self, job_id: str) -> dict:
        """``scontrol show job`` as a dict (JobState, ExitCode, Restarts, ...); {} once forgotten."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
        return dict(w.split("=", 1) for w in out.split() if "=" in w)

    def stop(self) -> None:
        for pid_file in [*self.work.glob("slurmd-*.pid"), self.work / "slurmctld.pid"]:
            try:
                os.kill(int(pid_file.read_text()), 15)
            except (OSError, ValueError):
                pass
        time.sleep(1)


def start(work: Path, nodes: int = 1) -> Cluster:
    if os.geteuid() != 0:
        raise Unavailable("starting munged, slurmctld and slurmd needs root (these tests run in CI as root)")
    _install()
    _start_munge()
    host = socket.gethostname().split(".")[0]
    for d in ("state", "spool", "log"):
        (work / d).mkdir(parents=True, exist_ok=True)
    conf = work / "slurm.conf"
    conf.write_text(f"""\
ClusterName=mpirltest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={work}/state
SlurmdSpoolDir={work}/spool/%n
SlurmctldPidFile={work}/slurmctld.pid
SlurmdPidFile={work}/slurmd-%n.pid
SlurmctldLogFile={work}/log/slurmctld.log
SlurmdLogFile={work}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
SchedulerType=sched/backfill
{_node_lines(host, nodes)}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = Cluster(work, conf, env)
    cluster.run("slurmctld", "-c")  # daemonizes; -c: no state from an earlier cluster
    names = [host] if nodes == 1 else [f"n{i}" for i in range(1, nodes + 1)]
    for name in names:
        (work / "spool" / name).mkdir(parents=True, exist_ok=True)
        cluster.run("slurmd", "-N", name)
    deadline = time.monotonic() + 60
    states: list[str] = []
    while time.monotonic() < deadline:
        states = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split()
        if len(states) == nodes and all(s in ("idle", "mixed", "allocated") for s in states):
            return cluster
        time.sleep(0.5)
    state = ",".join(states)
    logs = "".join(p.read_text()[-1500:] for p in sorted((work / "log").glob("*.log")))
    cluster.stop()
    raise Unavailable(f"the node did not come up within 60 s (sinfo: {state!r}); logs:\n{logs}")
