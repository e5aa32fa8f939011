"""The data-parallel learners part of ``mpirl bench gradients`` (Gorila's K learners, ``topology.learners``):
Ape-X's ``jobs/cartpole.toml`` with K = 1, 2 learners against one learner with as many torch threads, and the
Nature CNN's train step split over K learners (:mod:`mpirl.bench.learner_step_job`) against one learner's K
threads. :mod:`mpirl.bench.gradients` has the whole benchmark's description."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import h5py

from mpirl.bench import projection as proj
from mpirl.bench.report import Row, cores_note
from mpirl.bench.run_mpi import mpiexec_json, run_job

ROOT = Path(__file__).resolve().parents[2]
APEX_JOB = ROOT / "jobs" / "cartpole.toml"
APEX_SETS = ("run.target_return=nan", "run.wall_seconds=0", "run.env_steps=0", "replay.learning_starts=500",
             "log.interval=0.25")


def train_rate(run_dir: Path) -> float:
    """Train steps/s of an Ape-X run: the first learner's last train steps minus its first row's over their time
    (start-up and the replay's warm-up are behind the first row)."""
    with h5py.File(run_dir / "learner.h5", "r") as f:
        t, s = f["train/time"][()], f["train/train_steps"][()]
    if len(t) < 2 or not t[-1] > t[0]:
        raise RuntimeError(f"{run_dir}: learner.h5 holds {len(t)} train row(s), too few for a rate")
    return float((s[-1] - s[0]) / (t[-1] - t[0]))


def learner_rows(reps: int, learners: tuple, train_steps: int, timeout: float = 900) -> list[Row]:
    """``jobs/cartpole.toml`` (Ape-X, 1 buffer, 2 actors) with K = 1, 2, ... learners: train steps/s (each a
    batch of 64 whose parts the K learners train), and the bytes a train step adds on the learners'
    communicator (the gradient, loss and a flag per learner summed: a ring's ``2 (K - 1) / K x 4 (n_params + 1 +
    K)`` per learner, and the control gather's 32 B per learner)."""
    from mpirl.config import load
    from mpirl.registry import algorithm
    cfg, _ = load(APEX_JOB, [])
    n_params = algorithm("apex").check(cfg, cfg.world_size, str(APEX_JOB)).n_params
    rates: dict[tuple[int, int], list[float]] = {}  # (learners, torch threads of each) -> train steps/s
    runs = [(K, 1) for K in learners] + [(1, K) for K in learners if K > 1]  # 1 learner with K learners' threads
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            for K, threads in runs:
                run = run_job(K + 3, str(APEX_JOB), [*APEX_SETS, f"topology.learners={K}", "topology.actors=2",
                                                    f"agent.torch_threads={threads}",
                                                    f"run.train_steps={train_steps}", f"run.seed={rep + 1}"],
                              Path(tmp), f"learners-{K}x{threads}-{rep}", timeout, "gradients")
                rates.setdefault((K, threads), []).append(train_rate(run))
    rows = []
    for K in learners:
        label = f"{K} learner{'s' if K > 1 else ''}"
        head = f"apex job, {label} ({K + 3} ranks)"
        r = Row(f"{head}: train step rate", "train steps/s", label, "(none)",
                note=f"{train_steps} steps a run, batch 64, one torch thread a learner; {cores_note(K + 3)}")
        r.values = {label: rates[(K, 1)]}
        rows.append(r)
        if K > 1:
            grad = proj.ring_bytes_per_rank(4 * (n_params + 1 + K), K) + 32 * K  # LearnerPeers.sum_grads, .control
            b = Row(f"{head}: bytes per train step on the learners' communicator", "B", label, "(none)",
                    higher_is_better=False, note="ring allreduce of the gradient, loss and flags, per learner, "
                                                 "and the control gather")
            b.values = {label: [grad] * reps}
            rows.append(b)
            one = f"1 learner, {K} threads"
            e = Row(f"{head}: train step rate vs 1 learner with {K} threads", "train steps/s", label, one,
                    note=f"the same batch split {K} ways, one thread a learner, against one learner with "
                         f"agent.torch_threads = {K} (4 ranks): as many learner threads on each side; < 1 when the "
                         f"sums cost more than the compute they split; {cores_note(K + 3)}")
            e.values = {label: rates[(K, 1)], one: rates[(1, K)]}
            rows.append(e)
    return rows


def learner_step_rows(reps: int, learners: tuple, batch: int,
                      steps: int) -> tuple[list[Row], dict[tuple[int, int], list[float]]]:
    """The train step itself (:mod:`mpirl.bench.learner_step_job`): the Nature CNN's Ape-X step on a batch of
    ``batch`` split over K learners of one torch thread each, against one learner on the whole batch with K
    threads: both sides use K threads on the same cores, so the ratio is what data-parallel learners give over
    torch's intra-op threads, not over fewer threads. And one learner's K threads against its one thread. Each
    repetition is one job of each (learners, threads) in turn, so drifts of the machine hit every side. Also
    returned: the train steps/s per (learners, threads) and repetition."""
    runs = ([(1, 1)] if 1 in learners else []) + [r for K in learners if K > 1 for r in ((K, 1), (1, K))]
    got: dict[tuple[int, int], list[float]] = {r: [] for r in runs}
    for _ in range(reps):
        for K, threads in runs:
            out = mpiexec_json("step", {"batch": batch, "steps": steps, "reps": 1, "threads": threads},
                               timeout=660, n=K, module="mpirl.bench.learner_step_job")
            if out["threads"] != threads:
                raise RuntimeError(f"the learner step job ran {out['threads']} torch threads a rank, asked {threads}")
            got[(K, threads)] += out["rates"]
    rows = []
    alone = got.get((1, 1))
    for K in learners:
        if K == 1:
            continue
        split, threaded = got[(K, 1)], got[(1, K)]
        label, one = f"{K} learners x 1 thread", f"1 learner x {K} threads"
        r = Row(f"Ape-X train step of the Nature CNN, batch {batch}, {K} learners vs 1 with {K} threads",
                "train steps/s", label, one, target=0.9,
                note=f"{K} torch threads on each side, {cores_note(K)}; target 0.9: splitting the batch over "
                     f"learners costs at most a tenth against one learner's {K} threads; the part of each, the "
                     "gradient sum and the step")
        r.values = {label: split, one: threaded}
        rows.append(r)
        if alone is not None:
            t = Row(f"Ape-X train step of the Nature CNN, batch {batch}, 1 learner: {K} threads vs 1",
                    "train steps/s", one, "1 learner x 1 thread",
                    note=f"what {K} torch threads alone give one learner: one rank on {os.cpu_count() or 1} "
                         "cores")
            t.values = {one: threaded, "1 learner x 1 thread": alone}
            rows.append(t)
    return rows, got
