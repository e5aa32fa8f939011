"""Summarize a run directory from its HDF5 files alone (finished, running or killed).

Every file is opened read-only with ``locking=False``; a missing file, an empty
table or a file that cannot be opened becomes a line in ``notes``, not an error.

``summarize(run_dir)`` returns plain Python values (NaN/None where unknown)::

    run_dir, status ("running"|"completed"|"preempted"|"failed"|"unknown", or "dead": run.h5 says
        running but the heartbeat says its processes are gone; stop_reason then says why), stop_reason,
    start_time, end_time (ISO str or None), wall_seconds (s, from run.h5, or None),
    elapsed_seconds (s, latest `time` in any table), name, architecture, world_size,
    roles {"learner", "buffers", "actors"}, job {flat}, provenance {}, files {name: "ok"|reason},
    notes [str]
    learner: None or {rows, time_s, train_steps, train_steps_per_s (whole run),
        train_steps_per_s_recent, env_steps, loss, p_s, p_t, td_abs (means over the
        last 10 % of rows), compute_s, comm_s [s], compute_fraction, comm_fraction
        (of compute+comm, 0..1), bytes_in [B], samples_trained, bytes_per_sample [B],
        return_mean20, episodes, param_version}
    buffers: [{name, rank, capacity, architecture, rows, time_s, experiences_in,
        experiences_in_per_s (whole run), experiences_in_per_s_recent, fill,
        fill_fraction, stale_updates, priority_updates, consumed, alpha, bytes_in,
        bytes_out [B], total_priority, episodes, actors [ranks]}] sorted by rank
    episodes: {count, first20_mean, last20_mean, best, mean_length,
        curve {bin_seconds, t_mid [s], mean_return, count} (~8 equal time bins)}
    actors: [{actor, buffer, time_s, env_steps, env_steps_per_s, epsilon, param_version,
        throttled_s (its latest row), episodes, last20_mean, best20_mean (the mean return
        of its own last 20 episodes and of its best 20 in a row)}] sorted by actor
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpirl.metrics.formatting import fmt, fmt_bytes
from mpirl.metrics.run_file import RUN_FILE, load_judged, load_run, plain

NAN = float("nan")


def _last(t: dict, col: str) -> Any:
    """Last value of a column as a plain number, None if absent or empty."""
    a = t.get(col)
    return plain(a[-1]) if a is not None and len(a) else None


def _tail_mean(t: dict, col: str, frac: float = 0.1) -> float:
    """Mean of the finite values in the last ``frac`` of rows (at least one row)."""
    a = t.get(col)
    if a is None or not len(a):
        return NAN
    tail = np.asarray(a[-max(1, math.ceil(len(a) * frac)):], dtype=float)
    tail = tail[np.isfinite(tail)]
    return float(tail.mean()) if tail.size else NAN


def _ratio(a: Any, b: Any) -> float:
    return float(a) / float(b) if a is not None and b not in (None, 0) else NAN


def read_table(path: Path, name: str) -> dict[str, np.ndarray]:
    """One table of one HDF5 file as {column: array}; {} when the file or the table is not there (yet)."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            grp = f.get(name)
            return {k: np.asarray(v[...]) for k, v in grp.items()} if isinstance(grp, h5py.Group) else {}
    except (OSError, KeyError):
        return {}


def _learner(t: dict) -> dict[str, Any]:
    compute, comm = _last(t, "compute_s"), _last(t, "comm_s")
    both = (compute or 0.0) + (comm or 0.0)
    out = {"rows": len(t["time"]), "time_s": _last(t, "time")}
    for col in ("train_steps", "env_steps", "compute_s", "comm_s", "bytes_in",
                "samples_trained", "return_mean20", "episodes", "param_version", "skipped_batches"):
        out[col] = _last(t, col) if col in t else None
    for col in ("loss", "p_s", "p_t", "td_abs"):
        out[col] = _tail_mean(t, col)
    out["train_steps_per_s"] = _ratio(out["train_steps"], out["time_s"])
    out["train_steps_per_s_recent"] = _tail_mean(t, "train_steps_per_s")
    out["compute_fraction"] = _ratio(compute, both)
    out["comm_fraction"] = _ratio(comm, both)
    out["bytes_per_sample"] = _ratio(out["bytes_in"], out["samples_trained"])
    return out


def _buffer(name: str, entry: dict) -> dict[str, Any]:
    attrs, t = entry["attrs"], entry["tables"].get("buffer", {})
    rank = attrs.get("rank", name.split("_")[-1])
    out = {"name": name, "rank": int(rank) if str(rank).isdigit() else rank,
           "capacity": attrs.get("capacity"), "architecture": attrs.get("architecture"),
           "rows": len(t.get("time", ())), "time_s": _last(t, "time")}
    for col in ("experiences_in", "fill", "stale_updates", "priority_updates", "consumed",
                "alpha", "bytes_in", "bytes_out", "total_priority", "bytes_held"):
        out[col] = _last(t, col)
    # Memory per filled slot (frames stored once are only counted as they are touched).
    out["bytes_per_slot"] = _ratio(out["bytes_held"], out["fill"]) if out["bytes_held"] is not None else None
    out["experiences_in_per_s"] = _ratio(out["experiences_in"], out["time_s"])
    out["experiences_in_per_s_recent"] = _tail_mean(t, "experiences_in_per_s")
    out["fill_fraction"] = _ratio(out["fill"], out["capacity"])
    out["episodes"] = len(entry["tables"].get("episodes", {}).get("time", ()))
    out["actors"] = sorted(set(np.asarray(
        entry["tables"].get("actors", {}).get("actor", []), dtype=int).tolist()))
    return out


def in_time_order(tables: list[dict], *columns: str) -> list[np.ndarray]:
    """``time`` and ``columns`` of the episode tables that have rows, concatenated and sorted by time."""
    tables = [e for e in tables if len(e.get("time", ())) and all(c in e for c in columns)]
    if not tables:
        return [np.zeros(0) for _ in range(1 + len(columns))]
    t = np.concatenate([e["time"] for e in tables]).astype(float)
    order = np.argsort(t, kind="stable")
    return [t[order]] + [np.concatenate([e[c] for e in tables])[order] for c in columns]


def window_means(returns: np.ndarray, window: int) -> np.ndarray:
    """Mean return of every ``window`` consecutive episodes: element i covers episodes i .. i+window-1."""
    return np.convolve(returns, np.ones(window) / window, mode="valid")


def _episodes(eps: list[dict], bins: int = 8) -> dict[str, Any]:
    eps = [e for e in eps if "return" in e and len(e.get("time", ()))]
    if not eps:
        return {"count": 0, "first20_mean": NAN, "last20_mean": NAN, "best": NAN,
                "mean_length": NAN, "curve": {"bin_seconds": NAN, "t_mid": [],
                                              "mean_return": [], "count": []}}
    t, ret = in_time_order(eps, "return")
    ret = ret.astype(float)
    length = np.concatenate([e.get("length", np.full(len(e["time"]), np.nan)) for e in eps])
    nb = min(bins, len(t))
    edges = np.linspace(t[0], t[-1], nb + 1) if t[-1] > t[0] else np.array([t[0], t[0] + 1.0])
    nb = len(edges) - 1
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, nb - 1)
    counts = np.bincount(idx, minlength=nb)
    sums = np.bincount(idx, weights=ret, minlength=nb)
    means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return {"count": int(len(t)), "first20_mean": float(ret[:20].mean()),
            "last20_mean": float(ret[-20:].mean()), "best": float(ret.max()),
            "mean_length": float(np.nanmean(length.astype(float))),
            "curve": {"bin_seconds": float(edges[1] - edges[0]),
                      "t_mid": ((edges[:-1] + edges[1:]) / 2).tolist(),
                      "mean_return": means.tolist(), "count": counts.tolist()}}


def _actors(buffers: dict[str, dict]) -> list[dict[str, Any]]:
    latest: dict[int, dict] = {}
    for name, entry in buffers.items():
        t = entry["tables"].get("actors", {})
        if not len(t.get("actor", ())) or "time" not in t:
            continue
        for a in np.unique(t["actor"]):
            rows = np.flatnonzero(t["actor"] == a)[::-1]  # newest first on ties
            i = rows[np.argmax(t["time"][rows])]
            a = int(a)
            if a not in latest or t["time"][i] >= latest[a]["time_s"]:
                latest[a] = {"actor": a, "buffer": name, "time_s": plain(t["time"][i]),
                             **{c: plain(t[c][i]) if c in t else None for c in
                                ("env_steps", "env_steps_per_s", "epsilon", "param_version", "throttled_s",
                                 "env_errors")}}
    _, ret, actor = in_time_order([e["tables"].get("episodes", {}) for e in buffers.values()], "return", "actor")
    for a, entry in latest.items():
        mine = ret[actor == a].astype(float)
        means = window_means(mine, 20) if len(mine) >= 20 else None
        entry.update(episodes=int(len(mine)), last20_mean=None if means is None else plain(means[-1]),
                     best20_mean=None if means is None else plain(means.max()))
    return [latest[a] for a in sorted(latest)]


def _actor_count(world_size, buffers: int, actors: list, workers: int = 0, learners: int = 1) -> int:
    """Every rank after the learners, the buffers and the workers is an actor; else count the actors seen."""
    return int(world_size) - int(learners) - int(buffers) - int(workers) if world_size else len(actors)


def _workers(files: dict) -> list[dict[str, Any]]:
    """Per inference worker (``worker_<rank>.h5``): what it served, and its actors' latest rows."""
    out = []
    for name, e in sorted(files.items(), key=lambda kv: int(kv[0].split("_")[1]) if kv[0].startswith("worker_") else 0):
        if not name.startswith("worker_"):
            continue
        w, a = e["tables"].get("worker", {}), e["tables"].get("actors", {})
        lat50, lat95 = (np.asarray(w.get(k, []), dtype=float) for k in ("latency_p50_ms", "latency_p95_ms"))
        ok = np.isfinite(lat50)
        latest: dict[int, dict] = {}
        for i in range(len(a.get("time", ()))):
            latest[int(a["actor"][i])] = {k: a[k][i].item() for k in ("env_steps", "env_steps_per_s", "wait_s")}
        passes = _last(w, "passes")
        out.append({"name": name, "steps_served": _last(w, "steps_served"), "passes": passes,
                    "batch_mean": _ratio(_last(w, "requests"), passes), "batch_max": max(w.get("batch_max", [0]), default=0),
                    "latency_p50_ms": float(np.median(lat50[ok])) if ok.any() else math.nan,
                    "latency_p95_ms": float(np.median(lat95[ok])) if ok.any() else math.nan,
                    "infer_s": _last(w, "infer_s"), "throttled_s": _last(w, "throttled_s"),
                    "actors": [{"actor": k, **v} for k, v in sorted(latest.items())]})
    return out


def summarize(run_dir: Path) -> dict[str, Any]:
    """A summary of the run in ``run_dir`` as plain Python values (see module doc)."""
    data, status, reason = load_judged(run_dir)
    run, files = data["run"], data["files"]
    attrs, job, prov = run["attrs"], run["job"], run["provenance"]
    notes = [] if run["note"] == "ok" else [f"{RUN_FILE}: {run['note']}"]
    notes += [f"{n}.h5: {e['note']}" for n, e in files.items() if e["note"] != "ok"]
    learn = files.get("learner")
    train = learn["tables"].get("train", {}) if learn else {}
    if learn is None:
        notes.append("learner.h5: missing")
    elif learn["note"] == "ok" and len(train.get("time", ())) == 0:
        notes.append("learner.h5: table train is empty")
    bufs = {n: e for n, e in files.items() if n.startswith("buffer_")}
    n_learners = 1 + sum(n.startswith("learner_") for n in files)  # learner_<rank>.h5: data-parallel learners
    for n, e in bufs.items():
        for tab in ("buffer", "episodes", "actors"):
            if e["note"] == "ok" and not len(e["tables"].get(tab, {}).get("time", ())):
                notes.append(f"{n}.h5: table {tab} is empty")
    buffers = sorted((_buffer(n, e) for n, e in bufs.items()), key=lambda b: b["rank"])
    times = [b["time_s"] for b in buffers] + [_last(train, "time")]
    actors = _actors(bufs)
    workers = _workers(files)
    n_buf = job.get("topology.buffers", len(bufs))
    return {
        "run_dir": str(run_dir), "status": status,
        "stop_reason": reason, "start_time": attrs.get("start_time"),
        "end_time": attrs.get("end_time"), "wall_seconds": attrs.get("wall_seconds"),
        "elapsed_seconds": max((x for x in times if x is not None), default=None),
        "name": job.get("run.name"), "world_size": prov.get("world_size"),
        # what the learner says it trains from (a replay placement, or a queue), else the job's placement
        "architecture": (learn["attrs"].get("architecture") if learn else None) or job.get(
            "replay.architecture", buffers[0]["architecture"] if buffers else None),
        # worker_0.h5: the worker on the learner's rank (AW), no rank of its own
        "roles": {"learner": n_learners, "buffers": n_buf, "workers": len(workers),
                  "worker_on_learner": any(w["name"] == "worker_0" for w in workers),
                  "actors": _actor_count(prov.get("world_size"), n_buf, actors,
                                         sum(w["name"] != "worker_0" for w in workers), n_learners)},
        "job": job, "provenance": prov, "notes": notes,
        "files": {RUN_FILE: run["note"], **{f"{n}.h5": e["note"] for n, e in files.items()}},
        "learner": _learner(train) if len(train.get("time", ())) else None,
        "buffers": buffers,
        "episodes": _episodes([e["tables"].get("episodes", {}) for e in bufs.values()]),
        "actors": actors,
        "workers": workers,
    }


def format_summary(s: dict[str, Any]) -> str:
    """The summary as aligned plain text (about 30-50 lines)."""
    st = s["status"] + (f" ({s['stop_reason']})" if s.get("stop_reason") else "")
    wall = (fmt(s["wall_seconds"], ",.1f", " s") if s.get("wall_seconds") is not None
            else f"{fmt(s['elapsed_seconds'], ',.1f', ' s')} so far (last row)")
    r = s["roles"]
    out = [f"run           {s.get('name') or '-'}   ({s['run_dir']})",
           f"status        {st}",
           f"time          {s.get('start_time') or '-'} -> {s.get('end_time') or '-'}   wall {wall}",
           f"world         {fmt(s.get('world_size'))} ranks: {r['learner']} learner{'s' if r['learner'] > 1 else ''}"
           + (" (the actors' worker)" if r.get("worker_on_learner") else "") + f", {r['buffers']} buffer(s), "
           + (f"{r['workers']} worker(s), " if r.get("workers") and not r.get("worker_on_learner") else "")
           + f"{r['actors']} actors   architecture {s.get('architecture') or '-'}",
           "files         " + ", ".join(f"{k} {v}" for k, v in s["files"].items())]
    out += [f"note          {n}" for n in s["notes"]]
    L = s["learner"]
    out.append("")
    if L is None:
        out.append("learner       no rows yet")
    else:
        out += [f"learner       {L['rows']} rows, {fmt(L['time_s'], ',.1f', ' s')}",
                f"  train steps         {fmt(L['train_steps']):>14}   {fmt(L['train_steps_per_s'], ',.2f')} /s"
                f" (recent {fmt(L['train_steps_per_s_recent'], ',.2f')} /s)",
                f"  env steps           {fmt(L['env_steps']):>14}   episodes {fmt(L['episodes'])}",
                f"  loss (last 10%)     {fmt(L['loss'], '.4g'):>14}"
                + ("" if fmt(L['td_abs']) == "-" else f"   |TD| {fmt(L['td_abs'], '.4g')}"),
                *([] if fmt(L['p_s']) == fmt(L['p_t']) == "-" else  # an algorithm without priorities: no line
                  [f"  p_s / p_t (last 10%){fmt(L['p_s'], '.4g'):>14} / {fmt(L['p_t'], '.4g')}"]),
                f"  compute / comm      {fmt(100 * L['compute_fraction'], '.1f', ' %'):>14} / "
                f"{fmt(100 * L['comm_fraction'], '.1f', ' %')}   "
                f"({fmt(L['compute_s'], ',.1f', ' s')} / {fmt(L['comm_s'], ',.1f', ' s')})",
                f"  bytes in / sample   {fmt_bytes(L['bytes_per_sample']):>14}   total {fmt_bytes(L['bytes_in'])}",
                f"  return (last 20)    {fmt(L['return_mean20'], ',.2f'):>14}   "
                f"param version {fmt(L['param_version'])}"]
    out += ["", f"buffers       {'exp in':>12} {'exp/s':>10} {'fill / capacity':>22} "
                f"{'stale':>8} {'alpha':>7} {'KB/slot':>8}"]
    for b in s["buffers"]:
        fill = f"{fmt(b['fill'])}/{fmt(b['capacity'])} ({fmt(100 * b['fill_fraction'], '.0f', '%')})"
        out.append(f"  {b['name']:<11} {fmt(b['experiences_in']):>12} "
                   f"{fmt(b['experiences_in_per_s'], ',.1f'):>10} {fill:>22} "
                   f"{fmt(b['stale_updates']):>8} {fmt(b['alpha'], '.2f'):>7} "
                   f"{fmt(b['bytes_per_slot'] / 1e3 if b['bytes_per_slot'] else None, ',.1f'):>8}")
    e = s["episodes"]
    out += ["", f"episodes      {e['count']} over all buffers   mean length {fmt(e['mean_length'], ',.1f')}",
            f"  return        first 20 {fmt(e['first20_mean'], ',.2f')}   last 20 "
            f"{fmt(e['last20_mean'], ',.2f')}   best {fmt(e['best'], ',.2f')}"]
    c = e["curve"]
    if c["t_mid"]:
        out += [f"  curve ({len(c['t_mid'])} bins of {fmt(c['bin_seconds'], ',.1f', ' s')})",
                "    t [s]  " + "".join(f"{fmt(x, ',.0f'):>9}" for x in c["t_mid"]),
                "    return " + "".join(f"{fmt(x, ',.1f'):>9}" for x in c["mean_return"])]
    out += ["", f"actors        {'buffer':<10} {'epsilon':>8} {'env steps':>12} {'steps/s':>9} {'held back s':>12}"
            f" {'episodes':>9} {'return last 20':>15} {'best 20':>8}"]
    out += [f"  {a['actor']:<11} {a['buffer']:<10} {fmt(a['epsilon'], '.4f'):>8} "
            f"{fmt(a['env_steps']):>12} {fmt(a['env_steps_per_s'], ',.1f'):>9} "
            f"{fmt(a.get('throttled_s'), ',.1f'):>12} {fmt(a.get('episodes')):>9} "
            f"{fmt(a.get('last20_mean'), ',.1f'):>15} {fmt(a.get('best20_mean'), ',.1f'):>8}" for a in s["actors"]]
    for w in s.get("workers", []):
        out += ["", f"{w['name']:<13} steps served {fmt(w['steps_served'])}   forward passes {fmt(w['passes'])}   "
                    f"requests per pass {fmt(w['batch_mean'], ',.2f')} (max {fmt(w['batch_max'])})",
                f"  request latency p50 / p95  {fmt(w['latency_p50_ms'], ',.2f')} / {fmt(w['latency_p95_ms'], ',.2f')} ms"
                f"   inference {fmt(w['infer_s'], ',.1f', ' s')}   held back {fmt(w['throttled_s'], ',.1f', ' s')}",
                f"  {'actor':<9} {'env steps':>12} {'steps/s':>9} {'waiting s':>10}"]
        out += [f"  {a['actor']:<9} {fmt(a['env_steps']):>12} {fmt(a['env_steps_per_s'], ',.1f'):>9} "
                f"{fmt(a['wait_s'], ',.1f'):>10}" for a in w["actors"]]
    return "\n".join(out)


def first_reach(run_dir: Path, target: float, window: int = 20, actors: list[int] | None = None) -> dict[str, Any]:
    """When the mean return of the last ``window`` episodes first reached ``target``, from the episode rows.

    ``actors``: count only these actors' episodes (e.g. the least exploring one, as an
    evaluator would); default all. Returns ``{"seconds", "env_steps", "episodes"}``
    (None each if never): seconds since the job's start, and env steps summed over
    all actors as their messages last reported them by then. Exact per episode,
    unlike the learner's per-interval rows.
    """
    files = load_run(Path(run_dir))["files"]
    rows = [e["tables"].get("episodes", {}) for name, e in files.items() if name.startswith("buffer_")]
    t, ret, actor, steps = in_time_order(rows, "return", "actor", "env_steps")
    ret, actor, steps = ret.astype(float), actor.astype(int), steps.astype(float)
    none = {"seconds": None, "env_steps": None, "episodes": None}
    mine = np.isin(actor, actors) if actors is not None else np.ones(len(t), bool)
    if mine.sum() < window:
        return none
    means = window_means(ret[mine], window)
    hit = np.flatnonzero(means >= target)
    if not hit.size:
        return none
    i = int(np.flatnonzero(mine)[hit[0] + window - 1])  # the episode that completed the window
    before = t <= t[i]
    latest = {a: steps[before & (actor == a)].max() for a in np.unique(actor[before])}
    return {"seconds": float(t[i]), "env_steps": int(sum(latest.values())), "episodes": int(hit[0] + window)}
