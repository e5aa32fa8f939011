"""``mpirl info`` and ``mpirl watch`` for a gradient-family run: status, the updates (applied, dropped, their
staleness, the losses), each worker (env steps, episodes, the share of its time spent waiting for the exchange,
rollouts preempted) and the returns; from ``updates.h5`` and the ``worker_<rank>.h5`` files alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mpirl.metrics.run_file import load_judged
from mpirl.metrics.formatting import collapse_note, fmt, table

NAN = float("nan")


def _mean(x) -> float:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else NAN


def summarize(run_dir: Path) -> dict[str, Any]:
    data, status, reason = load_judged(run_dir)
    run = data["run"]
    attrs, job, prov = run["attrs"], run["job"], run["provenance"]
    notes = [] if run["note"] == "ok" else [f"run.h5: {run['note']}"]
    files = data["files"]
    up = files.get("updates", {"note": "missing", "tables": {}})
    if up["note"] != "ok":
        notes.append(f"updates.h5: {up['note']}")
    u, test = up["tables"].get("updates", {}), up["tables"].get("test", {})
    applied = np.asarray(u.get("applied", []), bool)
    workers, times, returns = [], [], []
    for name in sorted((k for k in files if k.startswith("worker_")), key=lambda k: int(k.split("_")[1])):
        entry = files[name]
        if entry["note"] != "ok":
            notes.append(f"{name}.h5: {entry['note']}")
        ro, ep = entry["tables"].get("rollouts", {}), entry["tables"].get("episodes", {})
        n = len(ro.get("time", ()))
        compute = float(ro["compute_s"][-1]) if n else NAN
        wait = float(ro["wait_s"][-1]) if n else NAN
        workers.append({"rank": int(name.split("_")[1]), "rollouts": n,
                        "env_steps": int(ro["env_steps"][-1]) if n else 0,
                        "episodes": len(ep.get("time", ())), "compute_s": compute, "wait_s": wait,
                        "wait_share": wait / (compute + wait) if n and compute + wait > 0 else NAN,
                        "preempted": int(np.sum(ro.get("preempted", []))),
                        "gradients": int(ro["gradients"][-1]) if n else 0,
                        "dropped": int(ro["dropped"][-1]) if n else 0,
                        "last20_return": _mean(ep.get("return", [])[-20:])})
        times.append(np.asarray(ep.get("time", []), float))
        returns.append(np.asarray(ep.get("return", []), float))
    tail = max(1, len(applied) // 10)
    entropy = _mean(np.asarray(u.get("entropy", []))[-tail:]) if len(applied) else NAN
    collapsed = collapse_note(entropy, float(up.get("attrs", {}).get("uniform_entropy", NAN)),
                              "raise a3c.entropy_coef or set agent.normalize_reward = true")
    if collapsed:
        notes.append(collapsed)
    t, r = (np.concatenate(times), np.concatenate(returns)) if times else (np.zeros(0), np.zeros(0))
    r = r[np.argsort(t, kind="stable")]
    window = int(job.get("run.return_window", 20) or 20)
    stale = np.asarray(u.get("staleness", []), float)
    return {
        "run_dir": str(run_dir), "status": status, "stop_reason": reason, "wall_seconds": attrs.get("wall_seconds"),
        "world_size": prov.get("world_size"), "job": job, "notes": notes, "workers": workers,
        "updates": {"rows": len(applied), "version": int(u["version"][-1]) if len(applied) else 0,
                    "applied": int(np.asarray(u.get("gradients", []))[applied].sum()) if len(applied) else 0,
                    "dropped": int(u["dropped"][-1]) if len(applied) else 0,
                    "staleness_mean": _mean(stale[applied]) if len(applied) else NAN,
                    "staleness_max": float(stale.max()) if len(stale) else NAN,
                    **{k: _mean(np.asarray(u.get(k, []))[-max(1, len(applied) // 10):])
                       for k in ("loss", "entropy", "grad_norm", "approx_kl", "clip_fraction")}},
        "episodes": {"count": len(r), "last_window": _mean(r[-window:]), "window": window,
                     "best_window": (float(np.max(np.convolve(r, np.ones(window) / window, "valid")))
                                     if len(r) >= window else NAN)},
        "test": ({k: float(test[k][-1]) for k in ("train_steps", "return_mean", "return_std", "episodes")}
                 if len(test.get("time", ())) else None),
    }


def format_summary(s: dict[str, Any]) -> str:
    job, u, e = s["job"], s["updates"], s["episodes"]
    st = s["status"] + (f" ({s['stop_reason']})" if s.get("stop_reason") else "")
    exchange = job.get("a3c.exchange", "-")
    server = exchange != "allreduce"
    loss = str(job.get("a3c.loss", "-")).upper()
    out = [f"run        {s['run_dir']}",
           f"status     {st}",
           f"wall       {fmt(s.get('wall_seconds'), ',.1f', ' s')}   world {fmt(s.get('world_size'))} ranks: "
           f"{'1 parameter server, ' if server else ''}{len(s['workers'])} worker(s)",
           f"gradients  {loss} on {job.get('env.id', '-')}, exchange {exchange}",
           f"updates    {u['version']:,} (gradients applied {u['applied']:,}, dropped {u['dropped']:,}); staleness "
           f"mean {fmt(u['staleness_mean'], '.2f')}, max {fmt(u['staleness_max'], '.0f')}",
           f"losses     loss {fmt(u['loss'], '.4g')}, entropy {fmt(u['entropy'], '.3f')}, gradient norm "
           f"{fmt(u['grad_norm'], '.3g')}" + (f", approx KL {fmt(u['approx_kl'], '.2g')}, clipped "
                                              f"{fmt(u['clip_fraction'], '.3f')}" if loss == "PPO" else ""),
           f"episodes   {e['count']:,}: mean return of the last {e['window']} {fmt(e['last_window'], ',.1f')}, best "
           f"{fmt(e['best_window'], ',.1f')}"]
    if s["test"]:
        t = s["test"]
        out.append(f"test       after {fmt(t['train_steps'])} updates: return {fmt(t['return_mean'], ',.1f')} ± "
                   f"{fmt(t['return_std'], ',.1f')} over {fmt(t['episodes'])} episodes")
    columns = [("rank", 5), ("rollouts", 9), ("env steps", 10), ("episodes", 9), ("wait %", 7), ("preempted", 10),
               ("gradients", 10), ("dropped", 8), ("last 20", 8)]
    out += table(columns, ([str(w["rank"]), f"{w['rollouts']:,}", f"{w['env_steps']:,}", f"{w['episodes']:,}",
                            fmt(100 * w["wait_share"], ".1f"), f"{w['preempted']:,}", f"{w['gradients']:,}",
                            f"{w['dropped']:,}", fmt(w["last20_return"], ",.1f")] for w in s["workers"]))
    out += [f"note: {n}" for n in s["notes"]]
    return "\n".join(out)


def frame(s: dict[str, Any]) -> str:
    """``mpirl watch``: progress toward the first stop condition set, then the summary."""
    from mpirl.metrics.watch import bar
    job = s["job"]
    steps = sum(w["env_steps"] for w in s["workers"])
    for key, done in (("run.train_steps", s["updates"]["version"]), ("run.env_steps", steps)):
        total = int(job.get(key, 0) or 0)
        if total:
            return f"{key.split('.')[1]:<10} {bar(min(done / total, 1.0))} {done:,} of {total:,}\n" + format_summary(s)
    return format_summary(s)
