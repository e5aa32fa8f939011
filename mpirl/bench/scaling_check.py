"""The scaling model checked against the jobs measured on this machine, before ``mpirl bench gradients`` projects it
to a cluster: its predictions of the a3c jobs with W > 1 workers and of K = 1, 2 data-parallel learners' train step,
each from inputs measured in the same run (:mod:`mpirl.bench.projection`, "On this machine"), beside what those
runs measured, repetition by repetition. Target: within 20 %.

The inputs, all measured, none fitted to the predicted runs:

* the W = 1 job of each exchange: its worker's compute per gradient rollout by rollout, and its exchange per
  gradient (:class:`mpirl.bench.gradients.OneWorker`);
* our allreduce of the buffer on W (or K) ranks (the benchmark's first part, 1 / its updates/s);
* a rank's share of a core with n ranks busy (:mod:`mpirl.bench.busy_cores_job`, ``a3c-cartpole``: the CartPole
  worker's rollout and gradient with no exchange, n = 1, each W and the cores; measured after each repetition's
  jobs);
* under async, the W = 1 server's seconds handling messages per update (``updates.h5``: ``busy_s`` /
  ``loop_updates``);
* one K-th of the Nature CNN's Ape-X train step with K ranks busy at once, no sums (``apex-cnn``; the slowest
  rank's: the learners wait for it).

W = 1 and the one learner's step are inputs, not predictions: the model gives them back by construction.
"""

from __future__ import annotations

import os
import statistics

import numpy as np

from mpirl.bench import projection as proj
from mpirl.bench.report import Row
from mpirl.bench.run_mpi import mpiexec_json

MODEL, MEASURED = "model", "measured"
WITHIN = 0.2
MLP, CNN = "CartPole MLP", "Nature CNN"
CORES = os.cpu_count() or 1
BUSY_SECONDS = 1.0  # the shortest busy-core repetition (a core's share needs the scheduler's time to even out)


def busy_rates(reps: int, seconds: float, n: int, workload: str, batch: int = 0) -> list[list[float]]:
    """Per repetition (of at least ``BUSY_SECONDS``), each of ``n`` busy ranks' calls/s of ``workload``."""
    seconds = max(seconds, BUSY_SECONDS)
    out = mpiexec_json("busy", {"workload": workload, "reps": reps, "seconds": seconds, "batch": batch},
                       timeout=300 + 4 * reps * max(seconds, 3.0), n=n, module="mpirl.bench.busy_cores_job")
    return out["rates"]


def add_shares(share: dict[int, list[float]], seconds: float, counts) -> None:
    """One repetition of a rank's share of a core alone with n ranks busy (their mean calls/s over one rank's),
    appended to ``share[n]`` for n = 1 (1.0) and each of ``counts``. Measured right after each repetition's jobs,
    so that the machine's drifts reach the inputs and the runs they predict alike."""
    alone = busy_rates(1, seconds, 1, "a3c-cartpole")[0][0]
    share.setdefault(1, []).append(1.0)
    for n in sorted(set(counts) - {1}):
        share.setdefault(n, []).append(float(np.mean(busy_rates(1, seconds, n, "a3c-cartpole")[0])) / alone)


def _ms(x: float) -> str:
    return f"{1e3 * x:.3g} ms"


def a3c_rows(reps: int, runs, ring: dict[tuple[str, int], list[float]], share: dict[int, list[float]]) -> list[Row]:
    """The a3c jobs with W > 1 workers: the model's updates/s from each repetition's inputs beside the job's."""
    rows = []
    for (ex, W), measured in sorted(runs.rates.items()):
        if W == 1 or ex not in ("allreduce", "async") or not runs.ones.get(ex):
            continue
        model = []
        for i in range(reps):
            one = runs.ones[ex][i]
            if ex == "allreduce":
                model.append(proj.local_allreduce(one.compute, one.exchange_s, W, share[W][i], ring[(MLP, W)][i]))
            else:
                n = max(W, CORES)
                model.append(proj.local_async(one.compute, one.exchange_s, W, share[W][i], one.server_s,
                                              n * share[n][i]))
        ones = runs.ones[ex]
        c = [x for o in ones for x in o.compute]
        inputs = (f"the W=1 job: compute {_ms(float(np.mean(c)))} a gradient (sd {_ms(float(np.std(c)))}), "
                  f"{'exchange' if ex == 'allreduce' else 'turnaround'} "
                  f"{_ms(statistics.median(o.exchange_s for o in ones))}; a core's share with {W} ranks busy "
                  f"{statistics.median(share[W]):.2f}")
        if ex == "allreduce":
            inputs += (f"; the largest of {W} computes {_ms(proj.lockstep_s(c, W))}; our allreduce on {W} ranks "
                       f"{_ms(statistics.median(ring[(MLP, W)]))}")
        else:
            inputs += f"; the server busy {_ms(statistics.median(o.server_s for o in ones))} an update"
        r = Row(f"scaling model vs measured: a3c {ex} job, {W} workers", "updates/s", MODEL, MEASURED,
                within=WITHIN, note=inputs)
        r.values = {MODEL: model, MEASURED: list(measured)}
        rows.append(r)
    return rows


def learner_rows(reps: int, seconds: float, step_rates: dict[tuple[int, int], list[float]], batch: int,
                 ring: dict[tuple[str, int], list[float]]) -> list[Row]:
    """K data-parallel learners' train step (one thread each): the model's steps/s beside the step job's."""
    rows = []
    for (K, threads), measured in sorted(step_rates.items()):
        if threads != 1:
            continue
        part = -(-batch // K)  # the largest part: the first batch mod K learners take a row more
        slowest = [1.0 / min(r) for r in busy_rates(reps, seconds, K, "apex-cnn", part)]
        rings = ring[(CNN, K)] if K > 1 else [0.0] * reps
        r = Row(f"scaling model vs measured: Ape-X train step of the Nature CNN, batch {batch}, {K} learner"
                f"{'s' if K > 1 else ''}", "train steps/s", MODEL, MEASURED, within=WITHIN,
                note=(f"{part} rows a learner with {K} rank{'s' if K > 1 else ''} busy "
                      f"{_ms(statistics.median(slowest))} (the slowest's)"
                      + (f"; our allreduce of the Nature CNN's gradient on {K} ranks "
                         f"{_ms(statistics.median(rings))}" if K > 1 else "; no sums: a check of the input")))
        r.values = {MODEL: [proj.local_learners(p, g) for p, g in zip(slowest, rings)], MEASURED: list(measured)}
        rows.append(r)
    return rows


def busy_counts(workers) -> set[int]:
    """The busy ranks whose share the a3c checks need: each W, and the cores (the async capacity's n x share(n))."""
    return set(workers) | {CORES}


def rows(reps: int, seconds: float, runs, ring: dict[tuple[str, int], list[float]], share: dict[int, list[float]],
         step_rates: dict[tuple[int, int], list[float]], batch: int) -> list[Row]:
    """Every check this run can make: the a3c jobs with W > 1 and the learners' step."""
    return a3c_rows(reps, runs, ring, share) + learner_rows(reps, seconds, step_rates, batch, ring)
