"""``mpirl info`` and ``mpirl watch`` for an IMPALA run: the shared learner-buffer-actor summary, then IMPALA's
learner statistics (losses, entropy, clipped ratios, policy lag) and how long the actors waited for their queues."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpirl.metrics import summary as shared
from mpirl.metrics.formatting import collapse_note, fmt
from mpirl.metrics.watch import frame as star_frame

STATS = ("loss", "policy_loss", "value_loss", "entropy", "rho_clipped", "grad_norm", "lag_mean", "lag_max")


def _held_back(run_dir: Path) -> float:
    """Seconds the actors waited for their queues (each actor's last ``throttled_s``, summed)."""
    total = 0.0
    for path in Path(run_dir).glob("buffer_*.h5"):
        try:
            with h5py.File(path, "r", locking=False) as f:
                t = f.get("actors")
                if t is None or not len(t["actor"]):
                    continue
                actor, held = t["actor"][()], t["throttled_s"][()]
                total += sum(float(held[actor == a][-1]) for a in np.unique(actor))
        except (OSError, KeyError):
            continue
    return total


def _replayed(run_dir: Path) -> int | None:
    """Trajectories the queues served from their replays (None: runs without a replay share, or written before)."""
    total, seen = 0, False
    for path in Path(run_dir).glob("buffer_*.h5"):
        try:
            with h5py.File(path, "r", locking=False) as f:
                t = f.get("buffer")
                if t is not None and "replayed" in t:
                    total, seen = total + int(t["replayed"][()].sum()), True
        except (OSError, KeyError):
            continue
    return total if seen else None


def summarize(run_dir: Path) -> dict[str, Any]:
    s = shared.summarize(run_dir)
    learner = Path(run_dir) / "learner.h5"
    train, test = shared.read_table(learner, "train"), shared.read_table(learner, "test")
    last = ({k: shared._last(test, k) for k in ("train_steps", "return_mean", "return_std", "episodes")}
            if len(test.get("time", ())) else None)
    s["impala"] = {**{k: shared._tail_mean(train, k) for k in STATS}, "held_back_s": _held_back(run_dir),
                   "replayed": _replayed(run_dir), "test": last}
    s["impala"]["collapsed"] = collapse_note(s["impala"]["entropy"], _uniform_entropy(learner),
                                             "raise impala.entropy_coef or set agent.normalize_reward = true")
    return s


def _uniform_entropy(learner: Path) -> float:
    """The uniform policy's entropy the learner wrote (nan: a Gaussian policy, or a run from before it was kept)."""
    try:
        with h5py.File(learner, "r", locking=False) as f:
            return float(f.attrs.get("uniform_entropy", np.nan))
    except OSError:
        return float("nan")


def format_summary(s: dict[str, Any]) -> str:
    job, q = s.get("job", {}), s["impala"]
    return "\n".join([
        shared.format_summary(s), "",
        f"IMPALA (V-trace) on {job.get('env.id', '-')}, trajectories of {job.get('impala.unroll', '-')} steps",
        f"  loss / policy / value (last 10%)  {fmt(q['loss'], '.4g')} / {fmt(q['policy_loss'], '.4g')} / "
        f"{fmt(q['value_loss'], '.4g')}",
        f"  entropy / rho clipped / |grad|    {fmt(q['entropy'], '.4g')} / {fmt(q['rho_clipped'], '.3g')} / "
        f"{fmt(q['grad_norm'], '.4g')}",
        f"  policy lag (versions) mean / max  {fmt(q['lag_mean'], '.2f')} / {fmt(q['lag_max'], '.0f')}",
        f"  actors waiting (all, summed)      {fmt(q['held_back_s'], ',.1f', ' s')}   "
        f"({'for each round' if job.get('impala.exchange') == 'sync' else 'for room in their queue'})",
        *([f"  replayed trajectories (all queues) {fmt(q['replayed'], ',')}   (impala.replay_share "
           f"{job.get('impala.replay_share', '-')})"] if q["replayed"] else []),
        _test_line(q["test"]), *([f"  note: {q['collapsed']}"] if q.get("collapsed") else [])])


def _test_line(t: dict | None) -> str:
    if not t:
        return "  test episodes                     none yet"
    return (f"  test ({fmt(t['episodes'])} episodes, train step {fmt(t['train_steps'])})  return "
            f"{fmt(t['return_mean'], ',.2f')} ± {fmt(t['return_std'], ',.2f')}")


def frame(s: dict[str, Any]) -> str:
    """``mpirl watch``: the learner-buffer-actor frame, then IMPALA's lag and entropy."""
    q = s["impala"]
    return (star_frame(s) + f"\nIMPALA        entropy {fmt(q['entropy'], '.3g')}, policy lag mean "
            f"{fmt(q['lag_mean'], '.2f')} max {fmt(q['lag_max'], '.0f')}, held back {fmt(q['held_back_s'], ',.1f', ' s')}"
            + (f"\nnote: {q['collapsed']}" if q.get("collapsed") else ""))
