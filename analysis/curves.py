"""Learning and system curves of one run, from its HDF5 files alone.

Usage::

    python analysis/curves.py RUN_DIR [-o OUT.png]

Writes one PNG (default RUN_DIR/curves.png) with six panels: episode return vs
wall time (points + rolling mean of 20 episodes), learner loss vs train steps,
p_s and p_t vs train steps, buffer fill (fraction of capacity) vs time, α per
buffer vs time, and the learner's cumulative compute vs communication seconds.
Works on finished, running and killed runs. Exit code 2 if RUN_DIR has no run.h5.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mpirl.metrics.summary import RUN_FILE, load_run  # noqa: E402


def rolling_mean(x: np.ndarray, window: int = 20) -> np.ndarray:
    """Trailing mean over up to ``window`` previous values (shorter at the start)."""
    c = np.concatenate([[0.0], np.cumsum(x, dtype=float)])
    i = np.arange(1, len(x) + 1)
    lo = np.maximum(0, i - window)
    return (c[i] - c[lo]) / (i - lo)


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", transform=ax.transAxes)


def plot_run(run_dir: Path, out: Path) -> Path:
    """Draw the curves of ``run_dir`` into the PNG ``out``; returns ``out``."""
    data = load_run(run_dir)
    files, job = data["files"], data["run"]["job"]
    train = files.get("learner", {}).get("tables", {}).get("train", {})
    bufs = {n: e for n, e in sorted(files.items()) if n.startswith("buffer_")}
    fig, axes = plt.subplots(3, 2, figsize=(12, 11))
    (ax_ret, ax_loss), (ax_p, ax_fill), (ax_alpha, ax_time) = axes
    title = job.get("run.name") or Path(run_dir).name
    fig.suptitle(f"{title}  ({data['run']['attrs'].get('status', 'unknown')}, "
                 f"{job.get('replay.architecture', '?')})")

    eps = [e["tables"]["episodes"] for e in bufs.values()
           if len(e["tables"].get("episodes", {}).get("time", ()))]
    if eps:
        t = np.concatenate([e["time"] for e in eps]).astype(float)
        r = np.concatenate([e["return"] for e in eps]).astype(float)
        order = np.argsort(t, kind="stable")
        t, r = t[order], r[order]
        ax_ret.plot(t, r, ".", ms=3, alpha=0.4, label="episode")
        ax_ret.plot(t, rolling_mean(r), "-", lw=2, label="mean of last 20")
        ax_ret.legend(loc="upper left")
    else:
        _empty(ax_ret, "episodes")
    ax_ret.set(title="episode return", xlabel="wall time [s]", ylabel="return")

    steps = train.get("train_steps")
    if steps is not None and len(steps):
        ax_loss.plot(steps, train["loss"])
        if np.all(train["loss"][np.isfinite(train["loss"])] > 0):
            ax_loss.set_yscale("log")
        ax_p.plot(steps, train["p_s"], label="p_s (sampled)")
        ax_p.plot(steps, train["p_t"], label="p_t (transferred)")
        ax_p.legend()
        ax_time.stackplot(train["time"], train["compute_s"], train["comm_s"],
                          labels=["compute", "communication"], alpha=0.8)
        ax_time.legend(loc="upper left")
    else:
        for ax in (ax_loss, ax_p, ax_time):
            _empty(ax, "learner rows")
    ax_loss.set(title="learner loss", xlabel="train steps", ylabel="loss")
    ax_p.set(title="priorities", xlabel="train steps", ylabel="mean raw priority")
    ax_time.set(title="learner time split", xlabel="wall time [s]",
                ylabel="cumulative seconds")

    drawn = False
    for name, e in bufs.items():
        b = e["tables"].get("buffer", {})
        if not len(b.get("time", ())):
            continue
        drawn = True
        cap = e["attrs"].get("capacity") or job.get("replay.capacity")
        fill = b["fill"] / cap if cap else b["fill"]
        ax_fill.plot(b["time"], fill, label=name)
        alpha = np.where(np.isfinite(b["alpha"]), b["alpha"], np.nan)
        ax_alpha.plot(b["time"], alpha, label=name)
    if drawn:
        ax_fill.legend()
        ax_alpha.legend()
        ax_alpha.axhline(1.0, color="grey", lw=0.8, ls="--")
    else:
        _empty(ax_fill, "buffer rows")
        _empty(ax_alpha, "buffer rows")
    ax_fill.set(title="replay fill", xlabel="wall time [s]", ylabel="fraction of capacity")
    ax_alpha.set(title="α = generated / consumed", xlabel="wall time [s]", ylabel="α")

    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("-o", "--out", type=Path, help="PNG to write (default RUN_DIR/curves.png)")
    args = parser.parse_args(argv)
    if not (args.run_dir / RUN_FILE).is_file():
        print(f"curves: {args.run_dir} has no {RUN_FILE}; is it a run directory?",
              file=sys.stderr)
        return 2
    out = plot_run(args.run_dir, args.out or args.run_dir / "curves.png")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
