"""The learners on a GPU: each family's train step against a bare PyTorch step, bf16, the frame cache on the device,
and an inference worker's forward pass, for the Nature CNN on 84x84x4 uint8 frames.

    mpirl bench gpu [--reps 5]                  # on CUDA; where torch sees none: "no CUDA: ..." and what it would run
    mpirl bench gpu --device cpu [--reps 5]     # the rehearsal: the same measurements on the CPU at tiny sizes

Every step is timed to ``torch.cuda.synchronize()`` (:func:`mpirl.bench.learner._seconds`), ours and the bare step
in turns, twice, so drifts of the machine hit both. *Bare* is a hand-written PyTorch step of the same network (the
learner's own module; Ape-X's in :mod:`mpirl.bench.learner`, IMPALA's and PPO's in :mod:`mpirl.bench.gpu_steps`),
the same loss, batch and device, on tensors already on the device, with ``torch.optim.Adam``
as a user builds it (no fused kernel asked for); the parts of the loss that need no gradient (targets, V-trace,
advantages) are computed without autograd on both sides, and each pass of the network runs with the same autograd
mode on both (``tests/test_bench_gpu.py`` checks it and that the bare losses equal ours). Ratios are bare seconds
over ours (1: no overhead); samples/s rows are the same measurements per sample.

* **Ape-X** (:mod:`mpirl.bench.learner`): the learner's train step from a buffer's reply (frames once) against the
  bare double-DQN step, Breakout's shape, batches 64 and 512, fp32 and ``agent.precision = "bf16"`` (the bare step
  under the same autocast), and ours bf16 against ours fp32.
* **IMPALA**: :meth:`ImpalaTraining.train <mpirl.algos.impala.learner.ImpalaTraining.train>` on a batch of 32
  trajectories of 20 steps as the queues serve it (numpy; the learner's V-trace loss, clipping, Adam) against a bare
  V-trace step. The IMPALA learner has no bf16 path: bf16 is measured on the bare step only (bare bf16 against
  bare fp32: what autocast would give it).
* **PPO** (the a3c family with PPO's Atari settings): a rollout of 128 steps of 8 games from numpy
  (:meth:`A3cModel.prepare <mpirl.agents.a3c.A3cModel.prepare>`: GAE), then 4 epochs of 4 minibatches, each
  :meth:`A3cModel.gradient` (the flat gradient into a host vector, as a worker sends it) and :meth:`A3cModel.apply`
  (clipped, Adam): the update one worker of ``exchange = "allreduce"`` makes alone, against a bare PPO update on the
  rollout already on the device. No bf16 path either: bare bf16 against bare fp32.
* **the frame cache on the device** (``replay.frame_cache``, :mod:`mpirl.replay.frame_cache`): the Ape-X train
  step from each reply of a buffer's shard (Breakout small: capacity 32,768, batch 64), the batch's stacks rebuilt on
  the device from the cached frames and the reply's misses, against the same step from replies that carry every
  distinct frame of the batch; the same draws both ways, in turns; the buffer's sampling is not timed.
* **the inference worker**: its forward pass for the observations of N actors of 4 games (the greedy actions, as
  :meth:`ActingPolicy.greedy <mpirl.agents.dqn.ActingPolicy.greedy>` computes them, the observations copied to the
  device and the actions back) on the device against the worker's own pass on the CPU with one thread (an inference
  worker's threads). Not the job layout (SEED's AWL of :mod:`mpirl.bench.workers` with the worker on the GPU): the
  workers' deciding policies hold their network on the CPU (``agent.device`` moves learners, not workers).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch

from mpirl.bench import learner as apex
from mpirl.bench.gpu_steps import ACTIONS, HIDDEN, OBS, impala_steps, ppo_steps
from mpirl.bench.report import MIN_REPS, Row

OURS, BARE = "ours", "bare PyTorch step"


@dataclass(frozen=True)
class Sizes:
    apex_batches: tuple  # Ape-X batches
    reply_capacity: int  # the shard a reply is sampled from
    impala: tuple  # (trajectories, unroll)
    ppo: tuple  # (unroll, games, epochs, minibatches)
    cache: tuple  # (capacity, batch, steps a repetition; as many of warm-up)
    actors: tuple  # inference: actors served at once
    games: int  # games per actor


FULL = Sizes((64, 512), 4096, (32, 20), (128, 8, 4, 4), (32_768, 64, 32), (3, 12, 48), 4)
TINY = Sizes((8,), 256, (2, 3), (4, 2, 1, 2), (512, 8, 4), (1,), 2)


def plan(sizes: Sizes = FULL) -> list[str]:
    """What the bench measures, one line a part."""
    s = sizes
    B, T = s.impala
    U, E, ep, mb = s.ppo
    cap, batch, _ = s.cache
    n = ", ".join(str(a * s.games) for a in s.actors)
    return [f"Ape-X learner step vs a bare double-DQN step, Breakout Nature CNN, batch "
            f"{' and '.join(map(str, s.apex_batches))}: fp32, bf16 (agent.precision), ours bf16 vs fp32",
            f"IMPALA learner step (V-trace) vs a bare step, {B} trajectories x {T} steps; bf16 on the bare step only "
            "(the IMPALA learner has no bf16 path)",
            f"PPO update of the a3c family vs a bare one, {U} steps x {E} games, {ep} epochs x {mb} minibatches; bf16 "
            "on the bare step only (the a3c model has no bf16 path)",
            f"frame cache on the device: the Ape-X train step with and without it, capacity {cap:,}, batch {batch}",
            f"inference worker forward pass of {n} observations: on the device vs the worker's CPU pass (1 thread)"]


TURNS = 2  # each measurement in turns with the others of its row, this many times (drifts of the machine hit all)


def _timed(ops: dict, reps: int, seconds: float, sync) -> dict[str, list[float]]:
    """Seconds per call of each of ``ops`` (name -> step), timed in turns, :data:`TURNS` times (the first
    repetition of each turn a warm-up)."""
    out: dict[str, list[float]] = {}
    for _ in range(TURNS):
        for name, op in ops.items():
            out.setdefault(name, []).extend(apex._seconds(op, reps, seconds, sync))
    return out


def _derived(name: str, unit: str, ours: str, ref: str, values: dict, per: float, note: str) -> Row:
    """A rate row from seconds per step: ``per`` samples a step."""
    r = Row(name, unit, ours, ref, note=note)
    r.values = {k: [per / v for v in values[k]] for k in (ours, ref)}
    return r


def _pair(name: str, ours: str, ref: str, values: dict, note: str) -> Row:
    r = Row(name, "s per step", ours, ref, higher_is_better=False, note=note)
    r.values = {ours: values[ours], ref: values[ref]}
    return r


def _family_rows(head: str, steps: tuple, reps: int, seconds: float, device: torch.device, note: str, per: int,
                 per_note: str, bf16_note: str) -> list[Row]:
    """A family without a bf16 path (IMPALA, PPO): ``steps`` (ours, bare fp32, bare bf16) timed in turns; ours
    against bare in seconds and in samples/s (``per`` samples a step), and bare bf16 against bare fp32."""
    ours, bare, bare16 = steps
    t = _timed({OURS: ours, BARE: bare, f"{BARE} bf16": bare16}, reps, seconds, apex.sync_of(device))
    return [_pair(f"{head}, fp32: ours vs bare", OURS, BARE, t, note),
            _derived(f"{head}, fp32: samples per second, ours vs bare", "samples/s", OURS, BARE, t, per, per_note),
            _pair(f"{head}: bare bf16 vs bare fp32", f"{BARE} bf16", BARE, t, bf16_note)]


# -- Ape-X

def apex_rows(device: torch.device, sizes: Sizes, reps: int, seconds: float) -> list[Row]:
    rows, dev = [], device.type
    sync = apex.sync_of(device)
    for batch in sizes.apex_batches:
        reply = apex._reply((OBS, np.uint8), ACTIONS, sizes.reply_capacity, batch)
        ops = {}
        for precision in ("fp32", "bf16"):
            ours, bare, _ = apex.steps((OBS, np.uint8), ACTIONS, HIDDEN, device, batch, precision, reply)
            ops[f"{OURS} {precision}"], ops[f"{BARE} {precision}"] = ours, bare
        t = _timed(ops, reps, seconds, sync)
        head = f"Ape-X learner step, Breakout Nature CNN, batch {batch}, {dev}"
        note = f"ours from the reply's views (frames once), bare from tensors already on {dev}"
        for p in ("fp32", "bf16"):
            rows.append(_pair(f"{head}, {p}: ours vs bare", f"{OURS} {p}", f"{BARE} {p}", t, note))
            rows.append(_derived(f"{head}, {p}: samples per second, ours vs bare", "samples/s", f"{OURS} {p}",
                                 f"{BARE} {p}", t, batch, note))
        rows.append(_pair(f"{head}: ours bf16 vs ours fp32", f"{OURS} bf16", f"{OURS} fp32", t,
                          "agent.precision = bf16: the passes under bfloat16 autocast, the loss and Adam in float32"))
    return rows


# -- IMPALA

def impala_rows(device: torch.device, sizes: Sizes, reps: int, seconds: float) -> list[Row]:
    B, T = sizes.impala
    ours, bare, bare16, _ = impala_steps(device, B, T)
    note = f"ours from the batch as numpy, bare from tensors already on {device.type}"
    return _family_rows(f"IMPALA learner step, {B} trajectories x {T} steps, Nature CNN, {device.type}",
                        (ours, bare, bare16), reps, seconds, device, note, B * T,
                        note + "; a sample is a trajectory step",
                        "the IMPALA learner has no bf16 path: what autocast gives the bare step")


# -- PPO (the a3c family)

def ppo_rows(device: torch.device, sizes: Sizes, reps: int, seconds: float) -> list[Row]:
    U, E, epochs, mb = sizes.ppo
    steps = ppo_steps(device, U, E, epochs, mb)[:3]
    note = (f"a step is the whole update; ours from the rollout as numpy, each minibatch's gradient through a host "
            f"vector (as a worker sends it), bare from tensors already on {device.type}")
    return _family_rows(f"PPO update, {U} steps x {E} games, {epochs} epoch(s) x {mb} minibatches, Nature CNN, "
                        f"{device.type}", steps, reps, seconds, device, note, U * E,
                        f"a sample is a rollout step of one game, trained {epochs} time(s)",
                        "the a3c model has no bf16 path: what autocast gives the bare update")


# -- the frame cache on the device

def cache_rows(device: torch.device, sizes: Sizes, reps: int, seconds: float = 0.0) -> list[Row]:
    """The Ape-X train step from a shard's replies with the learner's frame cache on ``device`` and without
    (``sizes.cache``'s steps a repetition, whatever ``seconds``)."""
    from mpirl.actor_learner.batch_sources import Batch
    from mpirl.bench.cache import TwoWays
    capacity, batch, steps = sizes.cache
    two = TwoWays(capacity, batch, device)
    training = apex._learner(device, (OBS, np.uint8), ACTIONS, HIDDEN, batch)
    sync = apex.sync_of(device)
    spi = 4.0  # new experiences arrive at 1 / samples_per_insert per trained one, as in a held job
    per: dict[str, list[float]] = {"with the cache": [], "without": []}
    hits = misses = 0
    for rep in range(reps + 1):  # the first: the cache's warm-up
        spent = {k: 0.0 for k in per}
        hits0, misses0 = int(two.cache.hits.sum()), int(two.cache.misses.sum())
        for _ in range(steps):
            two.arrive(spi)
            for cached, lay, v, _ in two.replies():
                t = time.perf_counter()  # the learner's side: the batch joined, the train step
                training.train(Batch(two.fields(cached, lay, v), v["priority"], v["probs"], two.shard.size))
                sync()
                spent["with the cache" if cached else "without"] += time.perf_counter() - t
        if rep:
            for k in per:
                per[k].append(spent[k] / steps)
            hits, misses = int(two.cache.hits.sum()) - hits0, int(two.cache.misses.sum()) - misses0
    dev = device.type
    r = Row(f"Ape-X train step with the frame cache on {dev} vs without, capacity {capacity:,}, batch {batch}",
            "s per step", "with the cache", "without", higher_is_better=False,
            note=f"replies joined and the stacks gathered on {dev}, then the train step; {steps} steps a repetition "
                 f"after {steps} of warm-up; the last repetition's frames: {hits:,} cached, {misses:,} sent")
    r.values = per
    return [r]


# -- the inference worker's forward pass

def inference_rows(device: torch.device, sizes: Sizes, reps: int, seconds: float) -> list[Row]:
    from mpirl.agents.dqn import ActingPolicy
    from mpirl.config import JobConfig
    cfg = JobConfig()
    cfg.agent.hidden, cfg.agent.network = list(HIDDEN), "nature"
    torch.manual_seed(0)
    policy = ActingPolicy(OBS, ACTIONS, cfg.agent)  # the worker's: its network on the CPU
    net = copy.deepcopy(policy.net).to(device)
    dev = device.type
    sync = apex.sync_of(device)
    rng = np.random.default_rng(0)
    rows = []
    threads = torch.get_num_threads()

    @torch.no_grad()
    def on_device(obs: np.ndarray) -> np.ndarray:
        return net(torch.as_tensor(obs).to(device)).argmax(dim=1).cpu().numpy()

    for actors in sizes.actors:
        n = actors * sizes.games
        obs = rng.integers(0, 256, (n, *OBS), dtype=np.uint8)
        agree = float(np.mean(on_device(obs) == policy.greedy(obs)))  # the same network: the same actions
        if agree < 0.9:  # (bar near-ties that the device's arithmetic rounds the other way)
            raise RuntimeError(f"the network on {dev} picks other actions than the worker's ({agree:.0%} agree)")
        ours, ref = f"{dev} forward pass", "the worker's, CPU 1 thread"
        values: dict[str, list[float]] = {ours: [], ref: []}
        for _ in range(TURNS):
            values[ours] += [n / s for s in apex._seconds(lambda: on_device(obs), reps, seconds, sync)]
            torch.set_num_threads(1)
            try:
                values[ref] += [n / s for s in apex._seconds(lambda: policy.greedy(obs), reps, seconds, sync)]
            finally:
                torch.set_num_threads(threads)
        r = Row(f"inference worker forward pass, {n} observations ({actors} actors x {sizes.games} games): "
                f"{dev} vs CPU", "observations/s", ours, ref,
                note=f"greedy actions of uint8 stacks, the observations to {dev} and the actions back; not an MPI job "
                     "(the workers' policies hold their network on the CPU)")
        r.values = values
        rows.append(r)
    return rows


PARTS = {"apex": apex_rows, "impala": impala_rows, "ppo": ppo_rows, "cache": cache_rows, "inference": inference_rows}


def run(reps: int = MIN_REPS, seconds: float = 0.3, device: str = "all", parts: tuple = tuple(PARTS)) -> list[Row]:
    """``device``: "cuda" or "all" (CUDA: where torch sees none, one line and what it would run, no rows), or "cpu"
    (the rehearsal: the same measurements at :data:`TINY` sizes on the CPU)."""
    if device in ("all", "cuda") and not torch.cuda.is_available():
        print(f"no CUDA: torch {torch.__version__} sees no CUDA device here; nothing measured. On a GPU "
              "`mpirl bench gpu` measures:", flush=True)
        for line in plan(FULL):
            print(f"  - {line}", flush=True)
        return []
    dev = torch.device("cuda" if device in ("all", "cuda") else device)
    sizes = FULL if dev.type == "cuda" else TINY
    threads = torch.get_num_threads()
    rows: list[Row] = []
    try:
        torch.set_num_threads(min(2, threads))  # the learner bench's threads: the host's side of each step
        for part in parts:  # a line a part as it ends: a run cut short by a timeout still tells how far it got
            start = time.perf_counter()
            got = PARTS[part](dev, sizes, reps, seconds)
            print(f"mpirl bench gpu: {part} on {dev.type}, {len(got)} rows in {time.perf_counter() - start:.0f} s",
                  flush=True)
            rows += got
    finally:
        torch.set_num_threads(threads)
    return rows
