"""Gradients: the gradient family's exchange (``agent.algorithm = "a3c"``), its allreduce against MPI's own, its jobs'
updates/s as workers are added, the scaling model checked against them, and a projection to cluster networks.

    mpirl bench gradients [--reps 5]

Four parts, all for two networks: the CartPole MLP of ``jobs/a3c_cartpole.toml`` and the Nature CNN
(``ActorCritic((4, 84, 84), 4, [512], "nature")``), their flat float32 gradients counted parameter by parameter.

* **the allreduce** (:mod:`mpirl.bench.allreduce_job`, one ``mpiexec`` per W = 2, 4, 8 ranks on this machine,
  oversubscribed beyond its cores): ours is exactly the reduction of ``a3c.exchange = "allreduce"``
  (:meth:`Peers.reduce`: a blocking ``Allreduce`` where every rank has a core of its own, else an ``Iallreduce``
  polled with a short back-off; not the optimizer step),
  the reference mpi4py's blocking ``Allreduce`` of the same buffer in a tight loop: updates/s, ratio ours / bare,
  target >= 0.9. The bytes of an update: the buffer, and a ring allreduce's bytes on the wire per rank,
  ``2 (W - 1) / W x buffer`` (the model; which algorithm Open MPI picks is its own).
* **the jobs**: ``jobs/a3c_cartpole.toml`` with W = 1, 2, 4, 8 workers, ``async`` (a parameter server: W + 1 ranks)
  and ``allreduce`` (W ranks), each a short run of ``run.train_steps`` updates (no target return, no wall clock, no
  final test round). Updates/s from ``updates.h5``: its last version minus its first over the time between its
  first and last rows (the first row is the origin: start-up is behind it). Bytes an update moves: a worker's
  message and the server's reply (their largest sizes, ``mpirl.gradients.messages``) through the server's link, or
  the ring's ``2 (W - 1) / W x 4 n_params`` per rank. Scaling efficiency against W = 1 of the same exchange:
  gradients/s (an update is one gradient under ``async``, W averaged under ``allreduce``) over W x the one worker's
  (under ``async`` that one worker waits for the server's reply to each gradient, and the server for the next one:
  neither is busy all the time, so two workers can more than double it).
* **data-parallel learners** (:mod:`mpirl.bench.data_parallel`): Ape-X's ``jobs/cartpole.toml`` (1 buffer,
  2 actors) with ``topology.learners`` K = 1, 2: train steps/s (the first learner's ``learner.h5``), the ratio to
  one learner with as many torch threads (``agent.torch_threads`` = K) as the K learners have in all, and the
  bytes a train step adds on the learners' communicator; and the train step alone
  (:mod:`mpirl.bench.learner_step_job`): the Nature CNN's on a batch of 256 split over K learners of one thread
  each against one learner with K threads (the same cores: the speed-up is what splitting the batch over processes
  gives over torch's own threads, not more threads), target 0.9; and one learner's K threads against its one
  thread (what the threads alone give).
* **the model checked** (:mod:`mpirl.bench.scaling_check`): the scaling model on this machine (its cores shared,
  its local transport measured) predicts the a3c jobs with W > 1 workers and K = 1, 2 learners' train step from
  inputs measured in the same run (the W = 1 jobs, our allreduce, a rank's share of a core with n ranks busy, a
  K-th of the step with K ranks busy), beside what those runs measured: target within 20 %.
* **on paper** (:mod:`mpirl.bench.projection`): from the W = 1 allreduce job's compute time per gradient (its
  worker's ``compute_s`` rollout by rollout: the CartPole MLP, its stragglers counted), one rollout's forward
  passes and gradient timed in this process for the Nature CNN (random 84x84 frames on this CPU; the game's own
  steps not counted; a GPU would compute faster and make the network's share, and so the loss of efficiency,
  larger), and one optimizer step on each network timed here: updates/s and efficiency for 8..128 workers on
  25 GbE and InfiniBand HDR, beside DD-PPO's published 107x on 128 GPUs. Printed as a table; the 128-worker rows
  are kept, labelled "projected, not measured".
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

from mpirl.bench import projection as proj
from mpirl.bench import scaling_check
from mpirl.bench.data_parallel import learner_rows, learner_step_rows
from mpirl.bench.report import MIN_REPS, Row, cores_note, rate
from mpirl.bench.run_mpi import mpiexec_json, run_job

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "a3c_cartpole.toml"
OURS, BARE = "mpirl Peers.reduce", "mpi4py Allreduce"
PROJECTED, DDPPO = "projected, not measured", "DD-PPO published (128 GPUs)"
NATURE = ((4, 84, 84), 4, [512], "nature")  # obs shape, actions, hidden, network
JOB_SETS = ("run.target_return=nan", "run.wall_seconds=0", "a3c.test_episodes=0")


def job_config():
    """The job's config and its checked spaces and parameter count."""
    from mpirl import config
    from mpirl.registry import algorithm
    cfg, _ = config.load(JOB, [])
    return cfg, algorithm("a3c").check(cfg, cfg.world_size, str(JOB))


def nature_params() -> int:
    from mpirl.agents.actor_critic import ActorCritic
    from mpirl.agents.networks import parameter_count, shapes_only
    return parameter_count(shapes_only(lambda: ActorCritic(*NATURE)))


def sizes() -> dict[str, int]:
    """Float32 elements of each network's gradient."""
    return {"CartPole MLP": job_config()[1].n_params, "Nature CNN": nature_params()}


# -- 1. the allreduce

def allreduce_rows(reps: int, seconds: float, ranks: tuple,
                   nets: dict[str, int]) -> tuple[list[Row], dict[tuple[str, int], list[float]]]:
    """The rows, and per (network, ranks) our allreduce's seconds a call per repetition (the scaling model's)."""
    rows, seconds_a_call = [], {}
    for W in ranks:
        out = mpiexec_json("allreduce", {"sizes": nets, "reps": reps, "seconds": seconds},
                           timeout=300 + 4 * W * reps * seconds * len(nets), n=W, module="mpirl.bench.allreduce_job")
        for label, n in nets.items():
            nbytes = 4 * n
            ring = proj.ring_bytes_per_rank(nbytes, W)
            r = Row(f"allreduce of the {label} gradient, {W} ranks", "updates/s", OURS, BARE, target=0.9,
                    note=f"{nbytes:,} B a buffer, {ring:,.0f} B on the wire per rank in a ring; {cores_note(W)}; "
                         f"{out[label]['calls']} calls a repetition")
            r.values = {OURS: out[label]["ours"], BARE: out[label]["bare"]}
            rows.append(r)
            seconds_a_call[(label, W)] = [1.0 / x for x in out[label]["ours"]]
    return rows, seconds_a_call


# -- 2. the jobs

def updates_rate(run_dir: Path) -> float:
    """Updates/s of a run: its last version minus its first over the time between its first and last rows."""
    with h5py.File(run_dir / "updates.h5", "r") as f:
        t, v = f["updates/time"][()], f["updates/version"][()]
    if len(t) < 2 or not t[-1] > t[0]:
        raise RuntimeError(f"{run_dir}: updates.h5 holds {len(t)} row(s), too few for a rate")
    return float((v[-1] - v[0]) / (t[-1] - t[0]))


@dataclasses.dataclass(frozen=True)
class OneWorker:
    """What a W = 1 job measured of its worker: its compute per gradient rollout by rollout (a rollout's play and
    gradient; one gradient a rollout under a2c) and its time in the exchange per gradient (allreduce: the optimizer
    step and the bookkeeping, no peers; async: the wait for the server's reply); under async also the server's
    seconds handling messages per update (``updates.h5``'s ``busy_s`` over ``loop_updates``)."""
    compute: tuple[float, ...]
    exchange_s: float
    server_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return float(np.mean(self.compute))


def one_worker(run_dir: Path) -> OneWorker:
    """The one worker's times, from its rows (the first row's cumulative times, start-up's warm-up in them, left
    out)."""
    paths = sorted(run_dir.glob("worker_*.h5"))
    if len(paths) != 1:
        raise RuntimeError(f"{run_dir}: {len(paths)} worker files, expected one")
    with h5py.File(paths[0], "r") as f:
        r = f["rollouts"]
        compute, wait, grads = (r[k][()] for k in ("compute_s", "wait_s", "gradients"))
    sent = np.diff(grads)
    if int(sent.sum()) < 2:
        raise RuntimeError(f"{paths[0]}: {int(sent.sum())} gradient(s) after the first rollout, too few")
    ok = sent > 0
    server_s = 0.0
    with h5py.File(run_dir / "updates.h5", "r") as f:
        if "busy_s" in f.attrs:  # a server's (async, sync); under allreduce rank 0 is a worker
            server_s = float(f.attrs["busy_s"]) / max(1, int(f.attrs["loop_updates"]))
    return OneWorker(tuple((np.diff(compute)[ok] / sent[ok]).tolist()),
                     float((wait[-1] - wait[0]) / (grads[-1] - grads[0])), server_s)


@dataclasses.dataclass
class JobRuns:
    """The jobs' updates/s per (exchange, W) and repetition, and each repetition's W = 1 worker per exchange."""
    rates: dict[tuple[str, int], list[float]]
    ones: dict[str, list[OneWorker]]


def job_bytes(exchange: str, W: int, n_params: int, message: int, reply: int) -> tuple[float, str]:
    """Bytes an update moves, and how they were counted."""
    if exchange == "allreduce":
        return proj.ring_bytes_per_rank(4 * n_params, W), "ring allreduce, per rank: 2 (W - 1) / W x 4 n_params"
    return float(message + reply), f"a worker's message ({message:,} B) in and the reply ({reply:,} B) out"


def job_rows(reps: int, workers: tuple, exchanges: tuple, train_steps: int, timeout: float = 900,
             between: Callable[[int], None] | None = None) -> tuple[list[Row], JobRuns]:
    """The rows, and what the runs measured (the scaling model's inputs and what it predicts); ``between(rep)``
    after each repetition's jobs."""
    from mpirl.gradients.messages import max_episodes, message_nbytes, reply_nbytes
    if workers[0] != 1:
        raise ValueError(f"workers must start with 1 (the scaling's and the projection's baseline), got {workers}")
    cfg, checked = job_config()
    n = checked.n_params
    message, reply = message_nbytes(n, max_episodes(cfg, cfg.a3c)), reply_nbytes(n)
    rates: dict[tuple, list[float]] = {}
    ones: dict[str, list[OneWorker]] = {ex: [] for ex in exchanges}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            for ex in exchanges:
                for W in workers:
                    ranks = W + (ex != "allreduce")
                    run = run_job(ranks, str(JOB), [*JOB_SETS, f"a3c.exchange={ex}", f"a3c.workers={W}",
                                                    f"run.train_steps={train_steps}", f"run.seed={rep + 1}"],
                                  Path(tmp), f"{ex}-{W}-{rep}", timeout, "gradients")
                    rates.setdefault((ex, W), []).append(updates_rate(run))
                    if W == 1:
                        ones[ex].append(one_worker(run))
            if between is not None:
                between(rep)
    rows = []
    for ex in exchanges:
        for W in workers:
            ranks = W + (ex != "allreduce")
            label = f"{W} worker{'s' if W > 1 else ''}"
            head = f"a3c {ex} job, {label} ({ranks} rank{'s' if ranks > 1 else ''})"
            ups = Row(f"{head}: update rate", "updates/s", label, "(none)",
                      note=f"{train_steps} updates a run; {cores_note(ranks)}")
            ups.values = {label: rates[(ex, W)]}
            rows.append(ups)
            nbytes, how = job_bytes(ex, W, n, message, reply)
            if nbytes > 0:
                b = Row(f"{head}: bytes per update", "B", label, "(none)", higher_is_better=False, note=how)
                b.values = {label: [nbytes] * reps}
                rows.append(b)
            if W > 1:
                per_update = W if ex == "allreduce" else 1
                linear = f"{W} x 1 worker (linear)"
                each = f"an update is {per_update} gradient{'s' if per_update > 1 else ''}"
                eff = Row(f"{head}: scaling efficiency vs W=1 (gradient rate)", "gradients/s", label, linear,
                          note=f"{each}; {cores_note(ranks)}")
                eff.values = {label: [per_update * r for r in rates[(ex, W)]],  # one worker: a gradient an update
                              linear: [W * r for r in rates[(ex, 1)]]}
                rows.append(eff)
    return rows, JobRuns(rates, ones)


# -- 3. on paper

def _threads(n: int):
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    return before


def measured_costs(reps: int, seconds: float) -> dict[str, dict[str, list[float]]]:
    """Timed in this process: one optimizer step on each network, and the Nature CNN's rollout forward passes and
    gradient (16 steps x 8 games of random frames, as the job's unroll and games), per repetition."""
    import torch
    from mpirl.agents.a3c import A3cModel, Rollout
    cfg, checked = job_config()
    before = _threads(cfg.agent.torch_threads)
    try:
        cpu = torch.device("cpu")
        mlp = A3cModel(checked.spaces.obs_shape, checked.spaces.action, cfg.agent, cfg.a3c, cpu, 1, True)
        shape, actions, hidden, network = NATURE
        cnn = A3cModel(shape, actions, dataclasses.replace(cfg.agent, hidden=hidden, network=network), cfg.a3c, cpu,
                       1, True)
        T, E = cfg.a3c.unroll, cfg.env.envs_per_actor
        rng = np.random.default_rng(0)
        ro = Rollout(T, E, shape, np.uint8)
        ro.obs[:] = rng.integers(0, 256, ro.obs.shape, dtype=np.uint8)
        ro.action[:] = rng.integers(0, actions, ro.action.shape)
        ro.reward[:] = rng.random(ro.reward.shape)
        ro.steps = T
        grad = np.zeros(cnn.n_params, np.float32)

        def rollout_and_gradient() -> None:
            for t in range(T):
                cnn.act(ro.obs[t], rng)
            cnn.gradient(cnn.prepare(ro), None, grad)

        def step(model: A3cModel):
            g = np.full(model.n_params, 1e-3, np.float32)
            return lambda: model.apply(g)
        return {"CartPole MLP": {"apply": [1 / r for r in rate(step(mlp), 1, reps, seconds)]},
                "Nature CNN": {"apply": [1 / r for r in rate(step(cnn), 1, reps, seconds)],
                               "compute": [1 / r for r in rate(rollout_and_gradient, 1, reps, seconds)]}}
    finally:
        _threads(before)


def costs_of(nets: dict[str, int], compute: dict[str, float], apply: dict[str, float],
             samples: dict[str, tuple] | None = None) -> dict[str, proj.Costs]:
    from mpirl.gradients.messages import max_episodes, message_nbytes, reply_nbytes
    cfg, _ = job_config()
    return {label: proj.Costs(compute[label], apply[label], 4 * n, message_nbytes(n, max_episodes(cfg, cfg.a3c)),
                              reply_nbytes(n), tuple((samples or {}).get(label, ())))
            for label, n in nets.items()}


def projection_rows(reps: int, nets: dict[str, int], mlp: list[OneWorker],
                    timed: dict[str, dict[str, list[float]]], workers: int = 128) -> tuple[list[Row], str]:
    """The 128-worker projections per repetition (the measured inputs of that repetition) as rows, and the table
    from the medians. The MLP's compute is the W = 1 job's worker's, rollout by rollout (its stragglers count); the
    Nature CNN's one timed mean (random frames: no spread)."""
    per_rep = []
    for i in range(reps):
        compute = {"CartPole MLP": mlp[i].compute_s, "Nature CNN": timed["Nature CNN"]["compute"][i]}
        apply = {k: v["apply"][i] for k, v in timed.items()}
        per_rep.append(costs_of(nets, compute, apply, {"CartPole MLP": mlp[i].compute}))
    rows = []
    for label in nets:
        for fabric in proj.FABRICS:
            for ex in proj.EXCHANGES:
                r = Row(f"{PROJECTED}: {label}, {ex} over {fabric.name}, {workers} workers: efficiency", "speed-up / W",
                        PROJECTED, DDPPO, note=f"DD-PPO: {proj.DDPPO_SPEEDUP:g}x on {proj.DDPPO_GPUS} GPUs, "
                                               "Wijmans et al. 2020")
                r.values = {PROJECTED: [proj.project(c[label], workers, fabric, ex).efficiency for c in per_rep],
                            DDPPO: [proj.DDPPO_SPEEDUP / proj.DDPPO_GPUS]}
                rows.append(r)
    pooled = tuple(x for one in mlp for x in one.compute)
    median = costs_of(nets, {"CartPole MLP": float(np.mean(pooled)),
                             "Nature CNN": statistics.median(timed["Nature CNN"]["compute"])},
                      {k: statistics.median(v["apply"]) for k, v in timed.items()}, {"CartPole MLP": pooled})
    return rows, proj.table(median)


def run(reps: int = MIN_REPS, seconds: float = 0.3, ranks: tuple = (2, 4, 8), workers: tuple = (1, 2, 4, 8),
        exchanges: tuple = ("async", "allreduce"), train_steps: int = 300, learners: tuple = (1, 2),
        learner_steps: int = 2000, step_batch: int = 256, step_steps: int = 10) -> list[Row]:
    missing = sorted({n for n in (*workers, *learners) if n > 1} - set(ranks))
    if missing:
        raise ValueError(f"ranks {ranks} must hold every W and K > 1 the scaling check predicts: add {missing}")
    nets = sizes()
    rows, ring = allreduce_rows(reps, seconds, ranks, nets)
    share: dict[int, list[float]] = {}  # the scaling check's shares of a core, measured beside each repetition
    jobs, runs = job_rows(reps, workers, exchanges, train_steps, between=lambda rep: scaling_check.add_shares(
        share, seconds, scaling_check.busy_counts(workers)))
    jobs += learner_rows(reps, learners, learner_steps)
    steps, step_rates = learner_step_rows(reps, learners, step_batch, step_steps)
    checked = scaling_check.rows(reps, seconds, runs, ring, share, step_rates, step_batch)
    timed = measured_costs(reps, seconds)
    mlp = runs.ones["allreduce" if "allreduce" in exchanges else exchanges[0]]
    projected, text = projection_rows(reps, nets, mlp, timed)
    print(text, flush=True)
    return rows + jobs + steps + checked + projected
