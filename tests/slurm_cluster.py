"""A real Slurm cluster for the tests: munged, slurmctld and one or more slurmd on this machine.

Debian's ``slurm-wlm``, ``munge``, ``libpmix2`` and ``libpmix-dev`` are installed
with apt when missing (root only). Everything the cluster runs is its own and is
ended by :meth:`Cluster.stop`: a ``munged`` on a private socket and key
(``AuthInfo=socket=...``), ``slurmctld`` and ``slurmd`` in the foreground from a
private ``slurm.conf`` (``SLURM_CONF``) on free ports, with their state under a
temporary directory. A munged or Slurm the machine already has is never touched.
Over-subscription is allowed: a 4-rank job runs on a 2-core node.

Each slurmd runs in a node namespace of its own (``unshare --mount --uts``): a
private ``/tmp`` (a directory of the cluster's, bind-mounted; the directories the
tests share with the jobs are bind-mounted back into it at their own paths), a
fresh ``/dev/shm`` and the node's name as host name. The step daemons and ranks it
forks inherit it, so two slurmd on one machine behave like two hosts where that
matters (each seen here):

* Slurm's PMIx plugin creates ``/tmp/spmix_appdir_<uid>_<job>.<step>`` on every
  node of a step; on a shared /tmp the second node's step fails ("File exists").
* Open MPI counts a peer as on its node when the node name PMIx gives for it (n1,
  n2) equals its own ``gethostname()``; with the machine's name on both nodes no
  rank had a node-mate (``COMM_TYPE_SHARED`` of size 1, no shared memory used).
  With the node's name as host name, ranks on one node use shared memory and
  ranks on different nodes TCP (over the machine's own address), as on a cluster;
  ``rank_hosts`` in run.h5 names each rank's node.
* Open MPI's shared-memory segments (``/dev/shm/sm_segment.<host>.<uid>.<job>.<rank>``)
  stay on the node, and whatever a killed rank leaves there goes with the node's
  /dev/shm when the cluster stops.

The network is shared: both nodes are 127.0.0.1, on ports of their own.

``start(work, nodes=1, shared=())`` returns a :class:`Cluster` or raises
:class:`Unavailable` with the reason (the tests then skip with it). With
``nodes=2`` the nodes are n1 and n2, and n1 advertises one GPU (a gres ``gpu`` whose
device file is /dev/null), so that a job component asking for ``--gres=gpu:1``
lands on n1. ``Cluster.processes()`` lists every live process the cluster started
(its daemons, and anything in its nodes' namespaces); ``Cluster.stop()`` ends them
all and returns the survivors (none).
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# libpmix-dev: Slurm's pmix plugin opens pmix2/lib/libpmix.so, a link only the -dev package ships
# (with libpmix2 alone `srun --mpi=pmix` fails: "can not load PMIx library").
PACKAGES = ("slurm-wlm", "munge", "libpmix2", "libpmix-dev")
TMP = Path("/tmp")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Unavailable(RuntimeError):
    """Slurm cannot run here (not root, nothing to install it with); the message says why."""


class Failed(RuntimeError):
    """A command or a daemon of the cluster failed; the message says which and how."""


def _run(cmd: list[str], timeout: float = 60, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise Failed(f"{' '.join(cmd)} did not finish within {timeout} s") from None
    if check and proc.returncode:
        raise Failed(f"{' '.join(cmd)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return proc


def _install() -> None:
    if shutil.which("slurmctld") and shutil.which("munged") and _has_pmix():
        return
    if not shutil.which("apt-get"):
        raise Unavailable("Slurm is not installed and there is no apt-get to install " + ", ".join(PACKAGES))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    try:
        if _run(cmd, timeout=900, env=env, check=False).returncode:
            _run(["apt-get", "update", "-q"], timeout=600, env=env)
            _run(cmd, timeout=900, env=env)
    except Failed as err:
        raise Unavailable(f"installing {', '.join(PACKAGES)} failed: {err}") from None


def _has_pmix() -> bool:
    return any(Path("/usr/lib").glob("*/pmix2/lib/libpmix.so"))


def _die_with_parent() -> None:
    """In a daemon's child before exec: SIGTERM it if the test process dies without stopping the cluster."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by its parent or by init) counts as gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _mount_ns(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def _node_line(host: str) -> str:
    out = _run(["slurmd", "-C"]).stdout.splitlines()
    line = next((x for x in out if x.startswith("NodeName=")), "")
    if not line:
        raise Failed(f"slurmd -C gave no node line: {out}")
    # keep what describes the hardware; memory a little under what slurmd found, so the node is never drained
    words = dict(w.split("=", 1) for w in line.split() if "=" in w)
    mem = max(int(int(words.get("RealMemory", "1024")) * 0.9), 256)
    keep = " ".join(f"{k}={words[k]}" for k in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket",
                                                  "ThreadsPerCore") if k in words)
    return f"NodeAddr=127.0.0.1 {keep} RealMemory={mem} State=UNKNOWN"


def _node_script(private: Path, shared: list[Path], name: str) -> str:
    """Shell run inside ``unshare --mount --uts``: the node's /tmp, /dev/shm and host name, then exec slurmd."""
    lines = ["set -e"]
    for path in shared:  # bind the shared directories into the private /tmp first: after the next mount
        inside = private / path.relative_to(TMP)  # their /tmp paths lead to the private directory
        lines.append(f"mkdir -p {shlex.quote(str(inside))} && mount --bind {shlex.quote(str(path))} "
                     f"{shlex.quote(str(inside))}")
    lines += [f"mount --rbind {shlex.quote(str(private))} /tmp",
              f"mount -t tmpfs -o mode=1777,size=2g shm-{name} /dev/shm",
              f"hostname {shlex.quote(name)}",
              'exec "$@"']
    return "\n".join(lines)


@dataclass
class Cluster:
    work: Path
    conf: Path
    env: dict
    munge_socket: Path
    nodes: list[str] = field(default_factory=list)
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)  # "munged", "slurmctld", "slurmd n1", ...
    namespaces: dict[str, str] = field(default_factory=dict)            # node -> its mount namespace

    def run(self, *cmd: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        return _run(list(cmd), timeout=timeout, env=self.env, check=check)

    def job_state(self, job_id: str) -> dict:
        """``scontrol show job`` as a dict (JobState, ExitCode, Restarts, ...); {} once forgotten.

        For a heterogeneous job, the first component's (the leader's); see :meth:`job_components`."""
        parts = self.job_components(job_id)
        return parts[0] if parts else {}

    def job_components(self, job_id: str) -> list[dict]:
        """``scontrol show job`` of every component of a job (one for an ordinary job)."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
        return [dict(w.split("=", 1) for w in line.split() if "=" in w) for line in out.splitlines() if line.strip()]

    def node_tmp(self, node: str) -> Path:
        """The directory that is ``/tmp`` on ``node``."""
        return self.work / "nodes" / node / "tmp"

    def _start(self, key: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.work / "log" / f"{key.replace(' ', '-')}.out", "ab")
        try:
            proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent)
        finally:
            log.close()
        self.daemons[key] = proc
        return proc

    def processes(self) -> dict[int, str]:
        """Every live process this cluster started: its daemons, and whatever runs in its nodes' namespaces.

        (The kernel may reuse a namespace's inode once the namespace is gone: ask while the cluster runs or
        right after stop(), not later.)"""
        found = {p.pid: key for key, p in self.daemons.items() if _alive(p.pid)}
        owners = {ns: node for node, ns in self.namespaces.items()}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) not in found:
                node = owners.get(_mount_ns(entry.name))
                if node and _alive(int(entry.name)):
                    try:
                        cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    except OSError:
                        cmd = "?"
                    found[int(entry.name)] = f"on {node}: {cmd}"
        return found

    def stop(self, timeout: float = 60) -> dict[int, str]:
        """Cancel every job, end every daemon and every process left on the nodes; returns the survivors (none).

        Order: jobs (their step daemons end the ranks), slurmd, anything left in the node namespaces
        (SIGKILL), slurmctld, munged last (the others use it until they exit)."""
        deadline = time.monotonic() + timeout
        if self.daemons.get("slurmctld") and self.daemons["slurmctld"].poll() is None:
            try:
                jobs = self.run("squeue", "-h", "-o", "%A", timeout=10, check=False).stdout.split()
                if jobs:
                    self.run("scancel", *jobs, timeout=10, check=False)
                while jobs and time.monotonic() < deadline - timeout / 2:  # half the time for the jobs to end
                    time.sleep(0.5)
                    jobs = self.run("squeue", "-h", "-o", "%A", timeout=10, check=False).stdout.split()
            except Failed:
                pass  # the daemons and whatever runs on the nodes are ended below in any case
        for key in [k for k in self.daemons if k.startswith("slurmd")]:
            _end(self.daemons[key], deadline)
        while time.monotonic() < deadline:
            left = [pid for pid, what in self.processes().items() if what.startswith("on ")]
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.2)
        for key in ("slurmctld", "munged"):
            if key in self.daemons:
                _end(self.daemons[key], deadline)
        shutil.rmtree(self.munge_socket.parent, ignore_errors=True)
        return self.processes()


def _end(proc: subprocess.Popen, deadline: float) -> None:
    """SIGTERM, then SIGKILL if it is still there at the deadline (or in 15 s at most); reaps it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=max(1.0, min(15.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _start_munge(cluster: Cluster) -> None:
    """A munged of the cluster's own: its own key and socket, in the foreground (so stop() can end it)."""
    d = cluster.work / "munge"
    d.mkdir(mode=0o700, exist_ok=True)
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = cluster.munge_socket
    sock.parent.chmod(0o755)
    proc = cluster._start("munged", ["munged", "--foreground", f"--socket={sock}", f"--key-file={key}",
                                     f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed"])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and proc.poll() is None:
        if _run(["munge", "-n", f"--socket={sock}"], check=False).returncode == 0:
            return
        time.sleep(0.2)
    out = (cluster.work / "log" / "munged.out").read_text()[-1000:]
    raise Failed(f"munged did not answer on {sock} within 15 s (exit {proc.poll()}): {out}")


def _start_node(cluster: Cluster, name: str, shared: list[Path]) -> None:
    private = cluster.node_tmp(name)
    private.mkdir(parents=True, exist_ok=True)
    private.chmod(0o1777)
    (cluster.work / "spool" / name).mkdir(parents=True, exist_ok=True)
    proc = cluster._start(f"slurmd {name}", ["unshare", "--mount", "--uts", "--propagation", "private", "--",
                                              "sh", "-c", _node_script(private, shared, name), "node",
                                              "slurmd", "-D", "-N", name])
    deadline = time.monotonic() + 15  # unshare execs sh, which execs slurmd: same pid, once in the namespace
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if Path(f"/proc/{proc.pid}/comm").read_text().strip() == "slurmd":
                cluster.namespaces[name] = _mount_ns(proc.pid)
                return
        except OSError:
            pass
        time.sleep(0.05)
    out = (cluster.work / "log" / f"slurmd-{name}.out").read_text()[-1000:]
    raise Failed(f"slurmd for node {name} did not start in its namespace (exit {proc.poll()}): {out}")


def start(work: Path, nodes: int = 1, shared: tuple = ()) -> Cluster:
    """Start a cluster with its files under ``work``; ``shared``: directories under /tmp the jobs must see
    as the tests do (``work`` always is); a job's output and run directories must be under one of them."""
    if os.geteuid() != 0:
        raise Unavailable("starting munged, slurmctld and slurmd needs root (these tests run in CI as root)")
    if not shutil.which("unshare"):
        raise Unavailable("unshare (util-linux) is needed to give each test node its own /tmp")
    _install()
    work = work.resolve()
    # The jobs run this checkout with this Python: a clone or a venv under /tmp (CI's may be) must stay visible
    # through the node's private /tmp, like the tests' own directories.
    code = {Path(__file__).resolve().parent.parent, Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent}
    shared_dirs = [p for p in {work, *code, *(Path(s).resolve() for s in shared)} if p.is_relative_to(TMP)]
    shared_dirs = sorted(p for p in shared_dirs if not any(p != q and p.is_relative_to(q) for q in shared_dirs))
    host = socket.gethostname().split(".")[0]
    names = [host] if nodes == 1 else [f"n{i}" for i in range(1, nodes + 1)]
    for d in ("state", "spool", "log"):
        (work / d).mkdir(parents=True, exist_ok=True)
    hardware = _node_line(host)
    node_lines = []
    for i, name in enumerate(names):
        port = "" if nodes == 1 else f"Port={_free_port()} "
        gres = "Gres=gpu:1 " if nodes > 1 and i == 0 else ""
        node_lines.append(f"NodeName={name} {port}{gres}{hardware}")
    if nodes > 1:
        (work / "gres.conf").write_text(f"NodeName={names[0]} Name=gpu File=/dev/null\n")
    # munged wants every directory above its socket open to all (o+x), which a pytest temporary directory
    # is not; a directory of the cluster's own under /run is (and the path stays short enough for a socket)
    munge_socket = Path(tempfile.mkdtemp(prefix="mpirl-test-munge-", dir="/run")) / "socket"
    conf = work / "slurm.conf"
    node_text = "\n".join(node_lines)
    conf.write_text(f"""\
ClusterName=mpirltest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
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
# heterogeneous jobs are started by the backfill scheduler only: every second, not every 30 s
SchedulerParameters=bf_interval=1
{"GresTypes=gpu" if nodes > 1 else ""}
{node_text}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
""")
    cluster = Cluster(work, conf, {**os.environ, "SLURM_CONF": str(conf)}, munge_socket, names)
    try:
        _start_munge(cluster)
        cluster._start("slurmctld", ["slurmctld", "-D", "-c"])  # -c: no state from an earlier cluster
        for name in names:
            _start_node(cluster, name, shared_dirs)
        deadline = time.monotonic() + 60
        states: list[str] = []
        while time.monotonic() < deadline:
            states = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split()
            if len(states) == nodes and all(s in ("idle", "mixed", "allocated") for s in states):
                return cluster
            dead = [k for k, p in cluster.daemons.items() if p.poll() is not None]
            if dead:
                raise Failed(f"{', '.join(dead)} exited during start-up")
            time.sleep(0.5)
        raise Failed(f"the nodes did not come up within 60 s (sinfo: {','.join(states)!r})")
    except BaseException as err:
        left = cluster.stop()
        if isinstance(err, Failed):
            logs = "".join(f"\n--- {p.name}\n" + p.read_text(errors="replace")[-1500:]
                           for p in sorted((work / "log").glob("*")))
            raise Failed(f"{err}{'; left running: ' + str(left) if left else ''}; logs:{logs}") from None
        raise
