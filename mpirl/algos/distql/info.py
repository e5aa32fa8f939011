"""``mpirl info`` for a DistQL run: status, the workers (episodes, env steps, compute and wait shares), the
merges and their bytes, the returns, the server's greedy evaluation and how much of the table it holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpirl.metrics.run_file import load_judged
from mpirl.metrics.formatting import fmt, fmt_bytes, table

NAN = float("nan")


def _mean(x) -> float:
    return float(np.mean(x)) if len(x) else NAN


def summarize(run_dir: Path) -> dict[str, Any]:
    data, status, reason = load_judged(run_dir)
    run = data["run"]
    attrs, job, prov = run["attrs"], run["job"], run["provenance"]
    entry = data["files"].get("qserver", {"note": "missing", "attrs": {}, "tables": {}})
    notes = [] if run["note"] == "ok" else [f"run.h5: {run['note']}"]
    if entry["note"] != "ok":
        notes.append(f"qserver.h5: {entry['note']}")
    t = entry["tables"]
    stats, merges, eps, ev = (t.get(k, {}) for k in ("workers", "merges", "episodes", "eval"))
    workers = []
    for w in sorted(set(np.asarray(stats.get("worker", []), int).tolist())):
        rows = np.flatnonzero(stats["worker"] == w)
        last = rows[-1]
        mine = eps["worker"] == w if len(eps.get("worker", ())) else np.zeros(0, bool)
        ret = eps["return"][mine] if len(mine) else np.zeros(0)
        compute, wait = float(stats["compute_s"][last]), float(stats["wait_s"][last])
        workers.append({"worker": w, "episodes": int(stats["episodes"][last]),
                        "env_steps": int(stats["env_steps"][last]), "compute_s": compute, "wait_s": wait,
                        "wait_share": wait / (compute + wait) if compute + wait > 0 else NAN,
                        "finished": bool(stats["bye"][last]), "torch_imported": bool(stats["torch_imported"][last]),
                        "last100_return": _mean(ret[-100:])})
    n_merges = len(merges.get("time", ()))
    table = {}
    path = Path(run_dir) / "qserver.h5"
    try:
        with h5py.File(path, "r", locking=False) as f:
            if "table" in f:
                seen = f["table/seen"][()]
                table = {"pairs": int(seen.size), "seen": int(seen.sum()),
                         "merges_per_pair": float(f["table/merges"][()][seen].mean()) if seen.any() else NAN}
    except OSError:
        pass
    return {
        "run_dir": str(run_dir), "status": status, "stop_reason": reason,
        "wall_seconds": attrs.get("wall_seconds"), "name": job.get("run.name"),
        "world_size": prov.get("world_size"), "job": job, "provenance": prov, "notes": notes,
        "server": entry["attrs"], "workers": workers,
        "merges": {"count": n_merges,
                   "pairs_in_mean": _mean(merges.get("pairs_in", [])),
                   "reply_pairs_mean": _mean(merges.get("reply_pairs", [])),
                   "bytes_in": float(np.sum(merges.get("bytes_in", []))),
                   "bytes_out": float(np.sum(merges.get("bytes_out", []))),
                   "bytes_per_exchange": (_mean(np.asarray(merges.get("bytes_in", []))
                                                + np.asarray(merges.get("bytes_out", []))) if n_merges else NAN),
                   "merge_s": float(np.sum(merges.get("merge_s", [])))},
        "episodes": {"count": len(eps.get("time", ())),
                     "first100_mean": _mean(eps.get("return", [])[:100]),
                     "last10pct_mean": (_mean(eps["return"][-max(1, len(eps["return"]) // 10):])
                                        if len(eps.get("return", ())) else NAN)},
        "eval": ({k: float(ev[k][-1]) if k in ev else 0.0
                  for k in ("merges", "return_mean", "return_std", "length_mean", "episodes", "capped")}
                 if len(ev.get("time", ())) else None),
        "table": table,
    }


def format_summary(s: dict[str, Any]) -> str:
    job, srv = s["job"], s["server"]
    st = s["status"] + (f" ({s['stop_reason']})" if s.get("stop_reason") else "")
    m, e = s["merges"], s["episodes"]
    out = [f"run        {s['run_dir']}",
           f"status     {st}",
           f"wall       {fmt(s.get('wall_seconds'), ',.1f', ' s')}   world {fmt(s.get('world_size'))} ranks: "
           f"1 Q-server, {len(s['workers'])} worker(s)",
           f"DistQL     {job.get('distql.variant', '-')} on {job.get('env.id', '-')}: "
           f"{fmt(srv.get('n_states'))} states x {fmt(srv.get('n_actions'))} actions; "
           f"{str(job.get('distql.mode', '-')).upper()} replies, {job.get('distql.exchange', '-')} exchange every "
           f"{fmt(job.get('distql.tau'))} episode(s)",
           f"merges     {m['count']:,}: {fmt(m['pairs_in_mean'], ',.1f')} pairs in, {fmt(m['reply_pairs_mean'], ',.1f')} "
           f"pairs out a merge; {fmt_bytes(m['bytes_per_exchange'])} an exchange ({fmt_bytes(m['bytes_in'])} in, "
           f"{fmt_bytes(m['bytes_out'])} out); merging {fmt(m['merge_s'], ',.3f', ' s')}",
           f"episodes   {e['count']:,}: mean return of the first 100 {fmt(e['first100_mean'], ',.1f')}, "
           f"of the last 10 % {fmt(e['last10pct_mean'], ',.1f')}"]
    ev = s["eval"]
    if ev:
        capped = (f"; {int(ev['capped'])} of {int(ev['episodes'])} cut at distql.eval_max_steps "
                  f"({fmt(job.get('distql.eval_max_steps'))} steps)" if ev["capped"] else "")
        out.append(f"greedy     server's table after {fmt(ev['merges'])} merges: return {fmt(ev['return_mean'], ',.1f')} "
                   f"± {fmt(ev['return_std'], ',.1f')}, length {fmt(ev['length_mean'], ',.1f')}{capped}")
    tb = s["table"]
    if tb:
        out.append(f"table      {tb['seen']:,} of {tb['pairs']:,} pairs seen "
                   f"({100 * tb['seen'] / max(tb['pairs'], 1):.1f} %), {fmt(tb['merges_per_pair'], ',.1f')} merges each")
    columns = [("worker", 6), ("episodes", 9), ("env steps", 10), ("compute", 9), ("wait", 8), ("wait %", 7),
               ("last 100", 9), ("torch", 6)]
    out += table(columns, ([str(w["worker"]), f"{w['episodes']:,}", f"{w['env_steps']:,}",
                            fmt(w["compute_s"], ",.1f", " s"), fmt(w["wait_s"], ",.1f", " s"),
                            fmt(100 * w["wait_share"], ".1f"), fmt(w["last100_return"], ",.1f"),
                            "yes" if w["torch_imported"] else "no"] for w in s["workers"]))
    out += [f"note: {n}" for n in s["notes"]]
    return "\n".join(out)


def frame(s: dict[str, Any]) -> str:
    """``mpirl watch``: the episodes played so far toward every worker's ``distql.episodes``, then the summary."""
    from mpirl.metrics.watch import bar
    job = s["job"]
    total = int(job.get("distql.episodes", 0) or 0) * max(len(s["workers"]), 1)
    played = sum(w["episodes"] for w in s["workers"])
    fraction = played / total if total else 0.0
    return f"episodes   {bar(fraction)} {played:,} of {total:,} (as of the workers' last exchanges)\n" + \
        format_summary(s)
