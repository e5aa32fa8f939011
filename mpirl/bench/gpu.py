"""The learners on a GPU: each family's train step against a bare PyTorch step, bf16, the frame cache on the device,
and an inference worker's forward pass, for the Nature CNN on 84x84x4 uint8 frames.

    mpirl bench gpu [--reps 5]                  # on CUDA; where torch sees none: "no CUDA: ..." and what it would run
    mpirl bench gpu --device cpu [--reps 5]     # the rehearsal: the same measurements on the CPU at tiny sizes

Every step is timed to ``torch.cuda.synchronize()`` (:func:`mpirl.bench.learner._seconds`), ours and the bare step
in turns, twice, so drifts of the machine hit both. *Bare* is a hand-written PyTorch step of the same network (the
learner's own module), the same loss, batch and device, on tensors already on the device, with ``torch.optim.Adam``
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
import math
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from mpirl.bench import learner as apex
from mpirl.bench.report import MIN_REPS, Row

OBS, ACTIONS, HIDDEN = (4, 84, 84), 4, [512]
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

def impala_batch(B: int, T: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``B`` trajectories of ``T`` steps as a queue serves them (:func:`~mpirl.agents.actor_critic.trajectory_spec`):
    random frames and actions, behaviour log-probabilities near the uniform policy's, a few terminations, no
    truncation."""
    rng = np.random.default_rng(seed)
    return {"obs": rng.integers(0, 256, (B, T + 1, *OBS), dtype=np.uint8),
            "action": rng.integers(0, ACTIONS, (B, T)).astype(np.int64),
            "reward": (rng.random((B, T)) < 0.1).astype(np.float32),
            "logp": (math.log(1 / ACTIONS) + 0.1 * rng.standard_normal((B, T))).astype(np.float32),
            "terminated": rng.random((B, T)) < 0.02, "truncated": np.zeros((B, T), bool),
            "final_value": np.zeros((B, T), np.float32), "version": np.zeros(B, np.int64)}


def _impala_cfg(device: torch.device):
    """``jobs/impala_breakout.toml``'s learner: the Nature CNN, Adam, gamma 0.99, gradient norm 40."""
    from mpirl.config import JobConfig
    cfg = JobConfig()
    a = cfg.agent
    a.algorithm, a.hidden, a.network, a.device = "impala", list(HIDDEN), "nature", str(device)
    a.gamma, a.lr, a.grad_clip, a.reward_clip = 0.99, 6e-4, 40.0, 1.0
    a.normalize_obs = a.normalize_reward = False
    cfg.impala.test_episodes = 0
    cfg.run.seed, cfg.run.env_steps = 1, 50_000_000
    return cfg


def impala_learner(device: torch.device, B: int):
    """The IMPALA learner's algorithm without MPI: what it reads of a role's context."""
    from mpirl.actor_learner.counters import Counters
    from mpirl.algos.impala.learner import ImpalaTraining
    cfg = _impala_cfg(device)
    cfg.replay.batch_size = B
    ctx = SimpleNamespace(cfg=cfg, spaces=SimpleNamespace(obs_shape=OBS, action=ACTIONS), seed=lambda: 1)
    return ImpalaTraining(ctx, np.random.default_rng(0), Counters(1, cfg.run.return_window))


def _categorical(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp_all = F.log_softmax(logits.float(), dim=-1)
    return logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def bare_impala_loss(net, b: dict, gamma: float, rho_bar: float, c_bar: float, value_coef: float,
                     entropy_coef: float, bf16: bool = False) -> torch.Tensor:
    """IMPALA's loss written out (no truncated steps: the batch has none): one pass over every observation with
    autograd, V-trace without it, the policy gradient, half the squared error to the targets and the entropy."""
    obs = b["obs"]
    B, T1 = obs.shape[:2]
    with torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits, values = net(obs.reshape(B * T1, *obs.shape[2:]))
    logits, values = logits.float().view(B, T1, -1)[:, :-1], values.float().view(B, T1)
    logp, entropy = _categorical(logits, b["action"])
    with torch.no_grad():
        v, boot = values[:, :-1], values[:, -1]
        ratio = torch.exp(logp - b["logp"])
        rho, c = ratio.clamp(max=rho_bar), ratio.clamp(max=c_bar)
        disc = gamma * (~b["terminated"]).float()
        deltas = rho * (b["reward"] + disc * torch.cat([v[:, 1:], boot[:, None]], 1) - v)
        acc, corr = torch.zeros_like(boot), torch.empty_like(v)
        for t in range(T1 - 2, -1, -1):
            acc = deltas[:, t] + disc[:, t] * c[:, t] * acc
            corr[:, t] = acc
        vs = v + corr
        adv = rho * (b["reward"] + disc * torch.cat([vs[:, 1:], boot[:, None]], 1) - v)
    policy = -(adv * logp).mean()
    value = 0.5 * (vs - values[:, :-1]).pow(2).mean()
    return policy + value_coef * value - entropy_coef * entropy.mean()


def impala_steps(device: torch.device, B: int, T: int):
    """``(ours, bare fp32, bare bf16, training)``: the learner's train step on the batch as numpy, and the bare
    step on it as tensors on ``device``, on the learner's network."""
    from mpirl.actor_learner.batch_sources import Batch
    from mpirl.agents.tensors import to_tensors
    training = impala_learner(device, B)
    fields = impala_batch(B, T)
    batch = Batch(fields, np.ones(B, np.float32), None, B)

    def ours():
        if training.train(batch) is None:
            raise RuntimeError(f"IMPALA's train step skipped the bench's batch: {training.agent.fault}")

    net, c, a = training.agent.net, training.cfg.impala, training.cfg.agent
    b = {k: v.clone() for k, v in to_tensors(fields, device).items()}
    opt = torch.optim.Adam(net.parameters(), lr=a.lr, eps=a.adam_eps)

    def bare(bf16: bool):
        def step():
            loss = bare_impala_loss(net, b, a.gamma, c.rho_bar, c.c_bar, c.value_coef, c.entropy_coef, bf16)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), a.grad_clip)
            opt.step()
        return step
    return ours, bare(False), bare(True), training


def impala_rows(device: torch.device, sizes: Sizes, reps: int, seconds: float) -> list[Row]:
    B, T = sizes.impala
    ours, bare, bare16, _ = impala_steps(device, B, T)
    ops = {OURS: ours, BARE: bare, f"{BARE} bf16": bare16}
    t = _timed(ops, reps, seconds, apex.sync_of(device))
    head = f"IMPALA learner step, {B} trajectories x {T} steps, Nature CNN, {device.type}"
    note = f"ours from the batch as numpy, bare from tensors already on {device.type}"
    return [_pair(f"{head}, fp32: ours vs bare", OURS, BARE, t, note),
            _derived(f"{head}, fp32: samples per second, ours vs bare", "samples/s", OURS, BARE, t, B * T,
                     note + "; a sample is a trajectory step"),
            _pair(f"{head}: bare bf16 vs bare fp32", f"{BARE} bf16", BARE, t,
                  "the IMPALA learner has no bf16 path: what autocast gives the bare step")]


# -- PPO (the a3c family)

def _ppo_cfg(device: torch.device, U: int, E: int, epochs: int, minibatches: int):
    """PPO's Atari settings (Schulman et al. 2017 and CleanRL's: clip 0.1, GAE 0.95, Adam 2.5e-4, gradient norm
    0.5) with ``U`` steps of ``E`` games."""
    from mpirl.config import JobConfig
    cfg = JobConfig()
    a, p = cfg.agent, cfg.a3c
    a.algorithm, a.hidden, a.network, a.device = "a3c", list(HIDDEN), "nature", str(device)
    a.gamma, a.lr, a.adam_eps, a.grad_clip, a.reward_clip = 0.99, 2.5e-4, 1e-5, 0.5, 1.0
    a.normalize_obs = a.normalize_reward = False
    p.loss, p.unroll, p.epochs, p.minibatches = "ppo", U, epochs, minibatches
    p.clip, p.gae_lambda, p.entropy_coef, p.value_coef, p.normalize_advantages = 0.1, 0.95, 0.01, 0.5, True
    cfg.env.envs_per_actor, cfg.run.seed = E, 1
    return cfg


def ppo_rollout(U: int, E: int, seed: int = 0):
    """A filled :class:`~mpirl.agents.a3c.Rollout`: random frames and actions, behaviour log-probabilities near the
    uniform policy's, values, a few terminations, no truncation."""
    from mpirl.agents.a3c import Rollout
    rng = np.random.default_rng(seed)
    ro = Rollout(U, E, OBS, np.uint8, ACTIONS)
    ro.obs[:] = rng.integers(0, 256, ro.obs.shape, dtype=np.uint8)
    ro.action[:] = rng.integers(0, ACTIONS, ro.action.shape)
    ro.logp[:] = math.log(1 / ACTIONS) + 0.1 * rng.standard_normal(ro.logp.shape)
    ro.value[:] = 0.1 * rng.standard_normal(ro.value.shape)
    ro.reward[:] = rng.random(ro.reward.shape) < 0.1
    ro.terminated[:] = rng.random(ro.terminated.shape) < 0.01
    ro.bootstrap[:] = 0.1 * rng.standard_normal(E)
    ro.steps = U
    return ro


def bare_gae(reward, value, bootstrap, terminated, gamma: float, lam: float):
    """GAE written out, ``[T, E]`` (no truncated steps), without autograd: ``(advantages, returns)``."""
    with torch.no_grad():
        keep = (~terminated).float()
        deltas = reward + gamma * keep * torch.cat([value[1:], bootstrap[None]]) - value
        adv, acc = torch.empty_like(value), torch.zeros_like(bootstrap)
        for t in range(value.shape[0] - 1, -1, -1):
            acc = deltas[t] + gamma * lam * keep[t] * acc
            adv[t] = acc
        return adv, adv + value


def bare_ppo_loss(net, obs, action, old_logp, adv, ret, clip: float, value_coef: float, entropy_coef: float,
                  bf16: bool = False) -> torch.Tensor:
    """PPO's clipped surrogate written out, advantages normalised over the minibatch, no value clipping."""
    with torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits, values = net(obs)
    logp, entropy = _categorical(logits, action)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = torch.exp(logp - old_logp)
    policy = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
    value = 0.5 * (ret - values.float()).pow(2).mean()
    return policy + value_coef * value - entropy_coef * entropy.mean()


def ppo_steps(device: torch.device, U: int, E: int, epochs: int, minibatches: int):
    """``(ours, bare fp32, bare bf16, model)``: one PPO update of the rollout, ours from numpy through the a3c
    model's gradients and applies, bare on the rollout as tensors on ``device``, on the model's network."""
    from mpirl.agents.a3c import A3cModel
    from mpirl.agents.tensors import to_tensors
    from mpirl.algos.a3c.builder import A3cBuilder
    cfg = _ppo_cfg(device, U, E, epochs, minibatches)
    model = A3cModel(OBS, ACTIONS, cfg.agent, cfg.a3c, device, seed=1, optimizer=True)
    builder, rng = A3cBuilder(), np.random.default_rng(2)
    ro = ppo_rollout(U, E)
    grad = np.zeros(model.n_params, np.float32)

    def ours():
        p = model.prepare(ro)
        for parts in builder.passes(cfg, p.n, rng):
            for idx in parts:
                if model.gradient(p, idx, grad) is None:
                    raise RuntimeError(f"the a3c model refused the bench's rollout: {model.fault}")
                model.apply(grad)

    net, a, c = model.net, cfg.agent, cfg.a3c
    b = {k: v.clone() for k, v in to_tensors(ro.fields(), device).items()}
    obs, action, old = b["obs"].flatten(0, 1), b["action"].flatten(), b["logp"].flatten()
    opt = torch.optim.Adam(net.parameters(), lr=a.lr, eps=a.adam_eps)

    def bare(bf16: bool):
        def update():
            adv, ret = bare_gae(b["reward"], b["value"], b["bootstrap"], b["terminated"], a.gamma, c.gae_lambda)
            adv, ret = adv.flatten(), ret.flatten()
            for _ in range(epochs):
                for idx in torch.randperm(len(obs), device=device).chunk(minibatches):
                    loss = bare_ppo_loss(net, obs[idx], action[idx], old[idx], adv[idx], ret[idx], c.clip,
                                         c.value_coef, c.entropy_coef, bf16)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(net.parameters(), a.grad_clip)
                    opt.step()
        return update
    return ours, bare(False), bare(True), model


def ppo_rows(device: torch.device, sizes: Sizes, reps: int, seconds: float) -> list[Row]:
    U, E, epochs, mb = sizes.ppo
    ours, bare, bare16, _ = ppo_steps(device, U, E, epochs, mb)
    ops = {OURS: ours, BARE: bare, f"{BARE} bf16": bare16}
    t = _timed(ops, reps, seconds, apex.sync_of(device))
    head = f"PPO update, {U} steps x {E} games, {epochs} epoch(s) x {mb} minibatches, Nature CNN, {device.type}"
    note = (f"a step is the whole update; ours from the rollout as numpy, each minibatch's gradient through a host "
            f"vector (as a worker sends it), bare from tensors already on {device.type}")
    return [_pair(f"{head}, fp32: ours vs bare", OURS, BARE, t, note),
            _derived(f"{head}, fp32: samples per second, ours vs bare", "samples/s", OURS, BARE, t, U * E,
                     f"a sample is a rollout step of one game, trained {epochs} time(s)"),
            _pair(f"{head}: bare bf16 vs bare fp32", f"{BARE} bf16", BARE, t,
                  "the a3c model has no bf16 path: what autocast gives the bare update")]


# -- the frame cache on the device

def cache_rows(device: torch.device, sizes: Sizes, reps: int, seconds: float = 0.0) -> list[Row]:
    """The Ape-X train step from a shard's replies with the learner's frame cache on ``device`` and without
    (``sizes.cache``'s steps a repetition, whatever ``seconds``)."""
    from mpirl.actor_learner.batch_sources import Batch
    from mpirl.actor_learner.shard_links import batch_fields, joined
    from mpirl.agents.dqn import transition_spec
    from mpirl.bench.replay import INSERT, Ours, Stream
    from mpirl.comm.messages import sample_layout
    from mpirl.replay.frame_cache import CacheMirror, FrameCache, cache_slots, settle_slots
    capacity, batch, steps = sizes.cache
    spec = transition_spec(OBS, np.uint8)
    mem, stream, rng = Ours(spec, capacity, seed=0), Stream(OBS, np.uint8, seed=0), np.random.default_rng(1)
    prio = lambda: rng.random(INSERT).astype(np.float32) + 0.1  # noqa: E731
    while mem.size < capacity:
        mem.insert(*mem.incoming(stream, prio()))
    framed = mem.framed
    slots = cache_slots(capacity * sum(d for d, _ in framed.values()), capacity, framed)
    cached, plain = sample_layout(spec, batch, framed, cache=True), sample_layout(spec, batch, framed)
    names = {lay: batch_fields(lay) for lay in (cached, plain)}
    bufs = {lay: lay.buffer() for lay in (cached, plain)}
    mirror = CacheMirror(slots)
    cache = FrameCache(1, slots, cached.counted["frames"][2], OBS[1:], device)
    training = apex._learner(device, (OBS, np.uint8), ACTIONS, HIDDEN, batch)
    sync = apex.sync_of(device)
    shard = mem.shard
    owed, spi = 0.0, 4.0  # new experiences arrive at 1 / samples_per_insert per trained one, as in a held job
    per: dict[str, list[float]] = {"with the cache": [], "without": []}
    hits = misses = 0
    for rep in range(reps + 1):  # the first: the cache's warm-up
        spent = {k: 0.0 for k in per}
        hits0, misses0 = int(cache.hits.sum()), int(cache.misses.sum())
        for _ in range(steps):
            owed += batch / spi
            while owed >= INSERT:
                mem.insert(*mem.incoming(stream, prio()))
                owed -= INSERT
            draw = int(rng.integers(2**63))
            for lay, m, key in ((cached, mirror, "with the cache"), (plain, None, "without")):
                buf = bufs[lay]
                views = lay.views(buf, batch, **{c: most for c, (_, _, most) in lay.counted.items()})
                sent = shard.sample_into(batch, np.random.default_rng(draw), views, m)
                if m is not None:
                    settle_slots(lay, buf, batch, sent.frames)
                lay.set(buf, rows=batch, **{f"{c}_rows": sent.frames for c in lay.counted})
                v = lay.views(buf)
                t = time.perf_counter()  # the learner's side: the batch joined, the train step
                fields = cache.join([v], names[lay]) if m is not None else joined([v], names[lay])
                training.train(Batch(fields, v["priority"], v["probs"], shard.size))
                sync()
                spent[key] += time.perf_counter() - t
        if rep:
            for k in per:
                per[k].append(spent[k] / steps)
            hits, misses = int(cache.hits.sum()) - hits0, int(cache.misses.sum()) - misses0
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
