"""DistQL's Q-server: merges per second and bytes per exchange, ALL against Partial.

    mpirl bench distql [--reps 5]

Two parts, both on Taxi-v4 (500 states x 6 actions = 3,000 pairs; 20 B a pair on the wire, so a whole-table
ALL reply is at most 60 kB):

* **the merge in one process.** Exchanges recorded from real play (4 tabular workers, tau = 10, their first
  300 episodes; ``mpirl.agents.tabular``) are merged into a fresh server table (DistQL Eq. 1), pairs per
  second, against the physical floor of the same memory traffic: numpy's scatter of the same pairs into two
  arrays (``q[idx] = q_i; eta[idx] = eta_i``). Then a whole exchange as the server handles it (merge, the
  reply's gather, packing it), ALL against Partial.
* **the job.** ``jobs/taxi_distql.toml`` on 5 ranks (4 workers, 2000 episodes) with ``mode = "all"`` and
  ``"partial"``, one after the other per repetition: merges per second of merge time, and the bytes an
  exchange moves (worker to server and back) from ``qserver.h5``'s ``merges`` rows.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import h5py
import numpy as np

from mpirl.bench.report import MIN_REPS, Row, rate
from mpirl.bench.run_mpi import run_job

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "taxi_distql.toml"
OURS, FLOOR, ALL, PARTIAL = "Eq. 1 merge", "numpy scatter floor", "ALL", "Partial"
TABLE_PAIRS = 500 * 6


def recorded_exchanges(workers: int = 4, episodes: int = 300, tau: int = 10, seed: int = 0) -> list[tuple]:
    """(idx, q, eta) of every exchange of ``workers`` Taxi workers playing ``episodes`` each, in turn."""
    from mpirl.agents.tabular import WorkerTable, epsilon_at, play_episode
    from mpirl.config import EnvConfig
    from mpirl.envs.discrete import make_tabular_env
    out = []
    for w in range(workers):
        env = make_tabular_env(EnvConfig(id="Taxi-v4"), bins=(), seed=seed + w)
        rng = random.Random(seed + w)
        table = WorkerTable(env.n_states, env.n_actions)
        for j in range(episodes):
            play_episode(env, table, epsilon_at(j), rng)
            if j % tau == 0 or j == episodes - 1:
                out.append(table.changed_pairs())
        env.close()
    return out


def in_process(reps: int, seconds: float) -> list[Row]:
    from mpirl.agents.tabular import ServerTable
    from mpirl.exchange import messages as msg
    exchanges = recorded_exchanges()
    pairs = sum(len(e[0]) for e in exchanges)
    tables = {}

    def fresh():
        tables["t"] = ServerTable(500, 6)
        tables["q"], tables["eta"] = np.zeros(TABLE_PAIRS), np.full(TABLE_PAIRS, 0.99)

    def merge_all():
        t = tables["t"]
        for idx, q, eta in exchanges:
            t.merge(idx, q, eta)

    def scatter_all():
        q, e = tables["q"], tables["eta"]
        for idx, qi, ei in exchanges:
            q[idx] = qi
            e[idx] = ei

    buf = np.empty(msg.reply_nbytes(TABLE_PAIRS), np.uint8)

    def handle(mode):
        def run():
            t = tables["t"]
            for k, (idx, q, eta) in enumerate(exchanges):
                t.merge(idx, q, eta)
                msg.pack_reply(buf, k, False, *(t.reply_all() if mode == ALL else t.reply_partial(idx)))
        return run

    fresh()
    merge = Row("Taxi: merge of recorded worker exchanges (Eq. 1)", "pairs/s", OURS, FLOOR,
                note=f"{len(exchanges)} exchanges, {pairs / len(exchanges):.0f} pairs each on average")
    merge.values[OURS] = rate(merge_all, pairs, reps, seconds, setup=fresh)
    merge.values[FLOOR] = rate(scatter_all, pairs, reps, seconds, setup=fresh)
    whole = Row("Taxi: an exchange on the server (merge, reply gather, pack)", "exchanges/s", PARTIAL, ALL)
    whole.values[ALL] = rate(handle(ALL), len(exchanges), reps, seconds, setup=fresh)
    whole.values[PARTIAL] = rate(handle(PARTIAL), len(exchanges), reps, seconds, setup=fresh)
    return [merge, whole]


def in_jobs(reps: int, episodes: int = 2000, workers: int = 4, timeout: float = 600) -> list[Row]:
    rate_row = Row(f"Taxi job, {workers} workers: merges per second of the server's merge time", "merges/s",
                   PARTIAL, ALL)
    bytes_row = Row(f"Taxi job, {workers} workers: bytes an exchange moves (worker to server and back)", "B",
                    PARTIAL, ALL, higher_is_better=False)
    reply_row = Row(f"Taxi job: the last ALL reply against the whole table ({TABLE_PAIRS:,} pairs x 20 B)", "B",
                    ALL, "whole table", higher_is_better=False)
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            for mode in (ALL, PARTIAL):
                run = run_job(workers + 1, str(JOB), [f"distql.workers={workers}", f"distql.mode={mode.lower()}",
                                                      f"distql.episodes={episodes}", f"run.seed={rep}",
                                                      "distql.eval_episodes=0"],
                              Path(tmp), f"{mode.lower()}-{rep}", timeout, "distql")
                with h5py.File(run / "qserver.h5", "r") as f:
                    m = f["merges"]
                    merges, merge_s = len(m["time"]), float(np.sum(m["merge_s"][()]))
                    moved = float(np.mean(m["bytes_in"][()] + m["bytes_out"][()]))
                    last_out = float(m["bytes_out"][-1])
                rate_row.values.setdefault(mode, []).append(merges / merge_s)
                bytes_row.values.setdefault(mode, []).append(moved)
                if mode == ALL:
                    reply_row.values.setdefault(ALL, []).append(last_out)
                    reply_row.values.setdefault("whole table", []).append(32.0 + 20 * TABLE_PAIRS)
    return [rate_row, bytes_row, reply_row]


def run(reps: int = MIN_REPS, seconds: float = 0.3, episodes: int = 2000, jobs: bool = True) -> list[Row]:
    rows = in_process(reps, seconds)
    if jobs:
        rows += in_jobs(reps, episodes)
    return rows
