"""``run.h5``: the entry point of a run directory, written by rank 0.

Layout::

    run.h5
      attrs: status ("running" | "completed" | "preempted" | "failed"; "stopped" in runs of DistQL before it
             kept checkpoints),
             restarts (resumes so far) and resume_<k>_{time,checkpoint,command},
             start_time, end_time (ISO 8601, local time with UTC offset),
             plus whatever finish_run_file adds (stop_reason, wall_seconds [s], ...)
      job/            attrs: the job as flat dotted keys ("replay.capacity" -> 65536)
      job/toml        scalar string dataset: the job file text as given
      provenance/     attrs: package_version, git_commit, world_size, hosts, ...
      learner   -> ExternalLink("learner.h5", "/")
      buffer_1  -> ExternalLink("buffer_1.h5", "/")

Links hold file names relative to the run directory, so the directory can be
moved or copied as a whole. Every function opens run.h5, writes, and closes it,
so the file is consistent on disk between calls.

Reading side: :func:`load_run` loads run.h5 and every rank file (learner.h5,
buffer_<rank>.h5) into numpy arrays, read-only and with ``locking=False`` so it
works on a running or killed job; problems become notes, not exceptions.
"""
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Any, Mapping

import h5py
import numpy as np

from mpirl.metrics import heartbeat
from mpirl.metrics.writer import set_attrs

RUN_FILE = "run.h5"
FINAL_STATUSES = ("completed", "preempted", "stopped", "failed")
RANK_FILE = re.compile(r"^(learner|buffer_\d+)\.h5$")  # rank files found without links


def now_iso() -> str:
    """Current local time as ISO 8601 with UTC offset, to the second."""
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"replay": {"capacity": 8}}`` -> ``{"replay.capacity": 8}`` (flat keys pass through)."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def plain(value: Any) -> Any:
    """An attribute value as a plain Python object (str, int, float, bool, list)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


def read_attrs(obj: h5py.HLObject) -> dict[str, Any]:
    """All attributes of an HDF5 object as plain Python values."""
    return {k: plain(v) for k, v in obj.attrs.items()}


def _open(run_dir: Path, mode: str) -> h5py.File:
    return h5py.File(Path(run_dir) / RUN_FILE, mode, locking=False)


def create_run_file(run_dir: Path, job_text: str, job: Mapping[str, Any],
                    provenance: Mapping[str, Any]) -> None:
    """Create ``run_dir/run.h5`` with status "running" (FileExistsError if it exists).

    Args:
        run_dir: the run directory (created if missing).
        job_text: the job file text (TOML) exactly as used, overrides applied or not.
        job: the resolved job; nested dicts are flattened to dotted keys.
        provenance: package_version, git_commit, world_size, hosts, mpi_library,
            python, start_time (ISO; now if absent), command_line, ...
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_FILE
    if path.exists():
        raise FileExistsError(f"{path} exists; a run directory is used once")
    prov = dict(provenance)
    prov.setdefault("start_time", now_iso())
    with _open(run_dir, "w-") as f:
        group = f.create_group("job")
        set_attrs(group, flatten(job))
        group.create_dataset("toml", data=job_text, dtype=h5py.string_dtype())
        set_attrs(f.create_group("provenance"), prov)
        set_attrs(f, {"status": "running", "start_time": prov["start_time"]})


def link_rank_files(run_dir: Path, links: Mapping[str, str]) -> None:
    """Add ExternalLinks ``name -> file`` (file relative to run_dir, root group).

    Example: ``{"learner": "learner.h5", "buffer_1": "buffer_1.h5"}``. A link that
    exists already is replaced. The target file need not exist yet.
    """
    with _open(run_dir, "r+") as f:
        for name, filename in links.items():
            if Path(filename).is_absolute():
                raise ValueError(f"link {name!r}: use a file name relative to the run "
                                 f"directory, not {filename!r}")
            if name in f or f.get(name, getlink=True) is not None:
                del f[name]
            f[name] = h5py.ExternalLink(str(filename), "/")


def finish_run_file(run_dir: Path, status: str, **attrs: Any) -> None:
    """Mark the run finished: root ``status``, ``end_time`` and any extra attrs.

    ``status`` is one of "completed", "preempted", "failed". Typical extras:
    ``stop_reason`` (str), ``wall_seconds`` (float, s). If ``wall_seconds`` is not
    given it is computed from ``start_time`` and now.
    """
    if status not in FINAL_STATUSES:
        raise ValueError(f"status must be one of {FINAL_STATUSES}, not {status!r}")
    end = now_iso()
    with _open(run_dir, "r+") as f:
        if "wall_seconds" not in attrs and "start_time" in f.attrs:
            try:
                start = _dt.datetime.fromisoformat(plain(f.attrs["start_time"]))
                attrs["wall_seconds"] = (_dt.datetime.fromisoformat(end) - start).total_seconds()
            except (TypeError, ValueError):
                pass
        set_attrs(f, {"status": status, "end_time": end, **attrs})


def mark_resumed(run_dir: Path, restart: int, checkpoint: str, job: Mapping[str, Any], command: str,
                 job_time: float) -> None:
    """A run continues from a checkpoint: status "running" again, the resume recorded.

    ``job``: the resumed job, flattened; its stop conditions (which may differ from the
    first start's) replace the stored ones, so summaries judge the run by them.
    """
    with _open(run_dir, "r+") as f:
        set_attrs(f["job"], flatten(job))
        for key in ("end_time", "stop_reason", "error", "failed_rank", "failed_role"):
            if key in f.attrs:
                del f.attrs[key]
        set_attrs(f, {"status": "running", "restarts": restart, f"resume_{restart}_time": now_iso(),
                      f"resume_{restart}_checkpoint": Path(checkpoint).name, f"resume_{restart}_command": command,
                      f"resume_{restart}_job_time": job_time})


def runs_under(path: str | Path) -> list[Path]:
    """The runs ``path`` names, oldest first (by their run.h5's time): itself when it holds a run.h5, else every
    directory below it, at any depth, that does. The one place the commands find runs (info, play, export, compare,
    tensorboard, :func:`mpirl.read_run`); ConfigError naming ``RUN_DIR`` when there is none."""
    from mpirl.domain import ConfigError
    p = Path(path)
    if (p / RUN_FILE).is_file():
        return [p]
    below = sorted((f for f in p.rglob(RUN_FILE) if f.is_file()), key=lambda f: (f.stat().st_mtime, str(f))) \
        if p.is_dir() else []
    if not below:
        why = "does not exist" if not p.exists() else "is not a directory" if not p.is_dir() else \
            f"holds no {RUN_FILE}, here or in a directory below"
        raise ConfigError("RUN_DIR", f"{path} {why}; pass a run directory such as runs/cartpole-20260101-120000, or "
                                     "a directory of runs such as runs/")
    return [f.parent for f in below]


def newest_run(path: str | Path) -> Path:
    """``path`` itself when it holds a run.h5, else the newest run below it (:func:`runs_under`)."""
    return runs_under(path)[-1]


def read_status(run_dir: Path) -> dict[str, Any]:
    """Root attributes of ``run_dir/run.h5`` (status, start_time, end_time, ...).

    Raises FileNotFoundError if there is no run.h5.
    """
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        raise FileNotFoundError(f"no {RUN_FILE} in {run_dir}")
    with h5py.File(path, "r", locking=False) as f:
        return read_attrs(f)


def read_algorithm(run_dir: Path) -> str:
    """The run's ``agent.algorithm`` from run.h5's job attributes; '' when it is not there (a run that predates
    the setting ran what a job without it runs: the setting's default)."""
    f, _ = open_h5(Path(run_dir) / RUN_FILE)
    if f is None:
        return ""
    with f:
        job = f.get("job")
        value = job.attrs.get("agent.algorithm", "") if isinstance(job, h5py.Group) else ""
    return value.decode() if isinstance(value, bytes) else str(value)


def open_h5(path: Path) -> tuple[h5py.File | None, str]:
    """Open read-only: ``(file, "ok")`` or ``(None, reason)``."""
    if not Path(path).exists():
        return None, "missing"
    try:
        try:
            return h5py.File(path, "r", locking=False), "ok"
        except OSError as e:  # already open in this process (e.g. through run.h5's links) with locking
            if "locking" not in str(e):
                raise
            return h5py.File(path, "r"), "ok"
    except OSError as e:
        return None, f"cannot open ({e}); if its writer was killed try `h5clear -s {path}`"


def read_table(group: h5py.Group) -> dict[str, np.ndarray]:
    """All columns of a table, cut to their common length (a crash may leave them uneven)."""
    cols = {k: v[()] for k, v in group.items() if isinstance(v, h5py.Dataset) and v.ndim == 1}
    n = min((len(v) for v in cols.values()), default=0)
    return {k: v[:n] for k, v in cols.items()}


def load_run(run_dir: Path, files: bool = True) -> dict[str, Any]:
    """Everything in a run directory as arrays: ``{"run": {...}, "files": {name: {...}}}``.

    ``run`` = ``{"note", "attrs", "job", "provenance", "links"}`` from run.h5; ``files[name]`` =
    ``{"note", "attrs", "tables": {table: {column: array}}}`` for the learner and every buffer (from run.h5's
    links and from the file names present), or nothing with ``files=False`` (run.h5 alone).
    """
    run_dir = Path(run_dir)
    run = {"note": "", "attrs": {}, "job": {}, "provenance": {}, "links": {}}
    f, run["note"] = open_h5(run_dir / RUN_FILE)
    if f is not None:
        with f:
            run["attrs"] = read_attrs(f)
            for grp in ("job", "provenance"):
                if isinstance(f.get(grp), h5py.Group):
                    run[grp] = read_attrs(f[grp])
            for name in f:
                link = f.get(name, getlink=True)
                if isinstance(link, h5py.ExternalLink):
                    run["links"][name] = link.filename
    if not files:
        return {"run": run, "files": {}}
    paths = {n: run_dir / fn for n, fn in run["links"].items()}
    for p in sorted(run_dir.glob("*.h5")):
        if RANK_FILE.match(p.name):
            paths.setdefault(p.stem, p)
    loaded = {}
    for name, path in sorted(paths.items()):
        entry = {"note": "", "attrs": {}, "tables": {}}
        rf, entry["note"] = open_h5(path)
        if rf is not None:
            with rf:
                try:  # a file being written (no locking) can be caught mid-flush: note it, read it next time
                    entry["attrs"] = read_attrs(rf)
                    for key, obj in rf.items():
                        try:
                            if isinstance(obj, h5py.Group):
                                entry["tables"][key] = read_table(obj)
                        except (OSError, KeyError, ValueError, RuntimeError) as e:
                            entry["note"] = f"table {key} unreadable ({e})"
                except (OSError, KeyError, ValueError, RuntimeError) as e:
                    entry["note"] = f"unreadable while being written ({e}); try again"
        loaded[name] = entry
    return {"run": run, "files": loaded}


def load_judged(run_dir: Path) -> tuple[dict[str, Any], str, Any]:
    """:func:`load_run` with the run's status judged: ``(data, status, stop_reason)``, where a run that says
    running but whose heartbeat says its processes are gone is "dead", the verdict its reason. Rank 0 writes the
    final status before it exits, so a job that ended between the read and the look at its processes is read
    again, and then says how it ended (its files whole)."""
    data = load_run(run_dir)
    status, reason = _status(data)
    if status == "running":
        alive, why = heartbeat.verdict(run_dir)
        if alive is False:
            data = load_run(run_dir)
            status, reason = _status(data)
            if status == "running":
                status, reason = "dead", why
    return data, status, reason


def _status(data: dict[str, Any]) -> tuple[str, Any]:
    attrs = data["run"]["attrs"]
    return attrs.get("status", "unknown"), attrs.get("stop_reason")
