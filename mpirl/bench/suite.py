"""``mpirl bench``: run benchmarks, print their tables and one summary of every ratio, write HDF5."""

from __future__ import annotations

import time
from pathlib import Path

from mpirl.bench.report import Row, format_rows, write_rows

BENCHES = ("replay", "cache", "transport", "pipeline", "actor", "fairness", "learner", "solve", "impala", "marl",
           "workers", "distql", "gradients", "startup", "continuous", "atari", "gpu")


def _module(name: str):
    import importlib
    return importlib.import_module(f"mpirl.bench.{name}")


def summary(results: dict[str, list[Row]]) -> str:
    lines = ["summary (ratio > 1: ours is better; medians of the repetitions)",
             f"  {'what':70s} {'ratio':>8s}  target"]
    for rows in results.values():
        for r in rows:
            if r.at_most is not None:
                tgt = f"{r.ours} <= {r.at_most:g} {r.unit} (is {r.median(r.ours):.3g})"
            elif r.within is not None:
                tgt = f"within {100 * r.within:g} %"
            elif r.target is not None:
                tgt = f">= {r.target:g}x"
            else:
                continue
            verdict = "met" if r.met else "MISSED"
            ratio = "-" if r.ratio_text == "-" else r.ratio_text + "x"
            lines.append(f"  {r.name[:70]:70s} {ratio:>8s}  {tgt}: {verdict}")
    return "\n".join(lines)


def run(what: str, reps: int, out: Path, **opts) -> int:
    names = BENCHES if what == "all" else (what,)
    results: dict[str, list[Row]] = {}
    failed = []
    for name in names:
        start = time.perf_counter()
        print(f"mpirl bench {name} ...", flush=True)
        try:
            rows = _module(name).run(reps=reps, **opts.get(name, {}))
        except RuntimeError as err:  # a missing reference or a failed job: report it, go on with the rest
            print(f"mpirl bench {name}: {err}", flush=True)
            failed.append(name)
            continue
        results[name] = rows
        print(format_rows(f"{name}  ({time.perf_counter() - start:.0f} s)", rows), flush=True)
        write_rows(out, name, rows)
    print()
    print(summary(results))
    print(f"\nwrote {out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
