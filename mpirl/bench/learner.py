"""The learner's own overhead: its train step on a reply, against the same network's bare PyTorch step.

    mpirl bench learner [--reps 5] [--device all|cpu|cuda]

*Ours* is the Ape-X learner's code from a batch as the buffers send it to the
update: the reply's views joined into a batch (:func:`mpirl.actor_learner.shard_links.joined`),
importance weights, :func:`mpirl.agents.tensors.to_tensors` (with frames once: the
stacks rebuilt by one gather on the device), the double-DQN step of
:class:`mpirl.agents.dqn.DQNLearner`, and the bookkeeping of
:meth:`ApexTraining.train <mpirl.algos.apex.learner.ApexTraining.train>`.
*Bare* is a hand-written double-DQN step of the same network on the same batch,
already as tensors on the device: forward, Huber loss with the weights, backward,
gradient clipping, Adam. Both sides run the same passes with the same autograd mode: the
double-DQN target's two passes without it (ours: ``n_step_target`` is a ``torch.no_grad``
function; bare: under ``torch.no_grad``), the Q pass with it (``tests/test_bench_gpu.py``
checks each pass's mode on both). The ratio is bare seconds over ours (1: no overhead).
CartPole (MLP 128x128, batch 64) and Breakout (Nature CNN, batch 64, frames once),
on the CPU and, when present, on CUDA (``--device cpu|cuda|all``; on CUDA each step is timed to its
``torch.cuda.synchronize()``).

One more row a device measures the layout a training pass gives the Nature convolutions
(:func:`mpirl.agents.networks.nature_floats`): the actor-critic's torso and shared layer, forward and backward, on
IMPALA's batch (32 trajectories of 21 stacks), its input channels-last against the stored layout; on CUDA (where
the learners keep the stored layout) in fp32 and under bf16 autocast, to say whether channels-last would pay there.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from mpirl.agents.dqn import transition_spec
from mpirl.algos.apex.learner import ApexTraining
from mpirl.bench.replay import INSERT, Ours, Stream
from mpirl.bench.report import MIN_REPS, Row
from mpirl.config import JobConfig
from mpirl.replay.frames import framed_fields
from mpirl.replay.weights import importance_weights
from mpirl.actor_learner.batch_sources import Batch
from mpirl.actor_learner.counters import Counters
from mpirl.actor_learner.shard_links import joined
from mpirl.bench.gpu_steps import optimize

SHAPES = [("cartpole", ((4,), np.float32), 2, [128, 128]), ("breakout", ((4, 84, 84), np.uint8), 4, [512])]
BATCH = 64


def _learner(device: torch.device, obs: tuple, n_actions: int, hidden: list, batch: int = BATCH,
             precision: str = "fp32") -> ApexTraining:
    """The Ape-X learner's algorithm without MPI: what it reads of a role's context, nothing more."""
    cfg = JobConfig()
    cfg.agent.hidden, cfg.replay.batch_size = hidden, batch
    cfg.agent.device, cfg.run.seed, cfg.agent.precision = str(device), 1, precision
    ctx = SimpleNamespace(cfg=cfg, spaces=SimpleNamespace(obs_shape=obs[0], n_actions=n_actions))
    return ApexTraining(ctx, np.random.default_rng(0), Counters(1, cfg.run.return_window))


def _reply(obs: tuple, n_actions: int, capacity: int = 4096, batch: int = BATCH) -> tuple[dict, list[str], int]:
    """A sampled reply of ``batch`` from a filled shard, as the buffer sends it (frames once for Atari)."""
    spec = transition_spec(*obs)
    mem = Ours(spec, capacity)
    stream, rng = Stream(*obs, seed=3), np.random.default_rng(4)
    while mem.size < capacity:
        mem.insert(*mem.incoming(stream, rng.random(INSERT) + 0.1))
    from mpirl.comm.messages import sample_layout
    lay = sample_layout(spec, batch, framed_fields(spec))
    buf = lay.buffer()
    views = lay.views(buf, batch, **({"frames": lay.counted["frames"][2]} if lay.counted else {}))
    s = mem.shard.sample_into(batch, rng, views)
    lay.set(buf, rows=batch, **({"frames_rows": s.frames} if lay.counted else {}))
    fields = [n for n in lay.fields if n not in ("ids", "versions", "probs", "priority")] + list(lay.counted)
    views = lay.views(buf)
    views["action"] %= n_actions  # the synthetic stream has 4 actions
    return views, fields, mem.shard.size


def bare_loss(online, target, b: dict, w: torch.Tensor, gamma_done: torch.Tensor, bf16: bool = False) -> torch.Tensor:
    """The double-DQN loss written out: the target's two passes without autograd and the Q pass with it, as
    :meth:`DQNLearner._forward <mpirl.agents.dqn.DQNLearner._forward>` runs them (its ``n_step_target`` is a
    ``torch.no_grad`` function), so both sides build the same graph; ``bf16``: the passes under bfloat16 autocast,
    the loss in float32, as ``agent.precision = "bf16"``."""
    with torch.autocast(w.device.type, dtype=torch.bfloat16, enabled=bf16):
        with torch.no_grad():  # double DQN: the online net picks, the target net values
            pick = online(b["next_obs"]).argmax(1, keepdim=True)
            y = (b["reward"] + gamma_done * target(b["next_obs"]).gather(1, pick).squeeze(1)).float()
        q = online(b["obs"]).gather(1, b["action"].view(-1, 1)).squeeze(1).float()
    return (w * F.smooth_l1_loss(q, y, reduction="none")).mean()


def _bare_step(online, target, optimizer, b: dict, w: torch.Tensor, gamma_done: torch.Tensor, clip: float,
               bf16: bool = False) -> None:
    optimize(online, optimizer, bare_loss(online, target, b, w, gamma_done, bf16), clip)


def _seconds(op, reps: int, seconds: float, sync) -> list[float]:
    out = []
    for rep in range(reps + 1):  # the first is a warm-up
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds or n < 3:
            op()
            sync()
            n += 1
        if rep:
            out.append((time.perf_counter() - t0) / n)
    return out


def sync_of(device: torch.device):
    """What waits for the device's queued work: ``torch.cuda.synchronize`` on CUDA, nothing on the CPU."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def steps(obs: tuple, n_actions: int, hidden: list, device: torch.device, batch: int = BATCH,
          precision: str = "fp32", reply: tuple | None = None):
    """``(ours, bare, learner)``: our train step from a reply's views and the bare step on the same batch as
    tensors already on ``device``, both on one network (the learner's); ``precision`` "bf16": ours with
    ``agent.precision = "bf16"``, the bare step under the same autocast. ``reply``: what :func:`_reply` gave for
    ``batch`` (made here if None)."""
    torch.manual_seed(0)
    views, fields, size = reply if reply is not None else _reply(obs, n_actions, batch=batch)
    learner = _learner(device, obs, n_actions, hidden, batch, precision)

    def ours():
        n = batch
        probs = views["probs"] * (len(views["probs"]) / n)
        learner.train(Batch(joined([views], fields), views["priority"], probs, size))

    # The bare step: the same network and batch, stacks as tensors on the device beforehand.
    from mpirl.agents.tensors import to_tensors
    agent = learner.agent
    b = {k: v.clone() for k, v in to_tensors({k: views[k] for k in fields}, device).items()}
    w = torch.as_tensor(importance_weights(views["probs"], size, 0.4), device=device)
    gamma_done = b["discount"] * (~b["done"]).float()
    online, target = agent.online, agent.target
    optimizer = torch.optim.Adam(online.parameters(), lr=1e-4)
    bf16 = precision == "bf16"
    bare = lambda: _bare_step(online, target, optimizer, b, w, gamma_done, 10.0, bf16)  # noqa: E731
    return ours, bare, learner


def bench(label: str, obs: tuple, n_actions: int, hidden: list, device: torch.device, reps: int,
          seconds: float, batch: int = BATCH) -> Row:
    ours, bare, _ = steps(obs, n_actions, hidden, device, batch)
    sync = sync_of(device)
    r = Row(f"learner train step, {label}, {device.type}", "s per step", "ours", "bare PyTorch step",
            higher_is_better=False, target=0.9,
            note=f"batch {batch}; ours from the reply's views, bare from tensors already on {device.type}")
    for _ in range(2):  # alternate, so drifts of the machine hit both
        r.values.setdefault("ours", []).extend(_seconds(ours, reps, seconds, sync))
        r.values.setdefault("bare PyTorch step", []).extend(_seconds(bare, reps, seconds, sync))
    return r


LAYOUT_BATCH = 32 * 21  # IMPALA's Atari batch: 32 trajectories of 20 steps and the bootstrap stack


def layout(reps: int, seconds: float, batch: int = LAYOUT_BATCH, device: torch.device = torch.device("cpu"),
           precision: str = "fp32") -> Row:
    """The Nature torso's training pass (forward and backward to every weight) with its input channels-last against
    the input in the stored layout: the same network, the same uint8 batch scaled the same way. On the CPU the
    channels-last side is :func:`~mpirl.agents.networks.nature_floats` as the learners call it; on CUDA (where
    ``nature_floats`` leaves the layout alone) the same reorder of the bytes is made here, so the row says whether
    extending it to the GPU would pay, in fp32 and (``precision`` "bf16") under bf16 autocast."""
    from mpirl.agents.actor_critic import ActorCritic
    from mpirl.agents.networks import image_floats, nature_floats

    torch.manual_seed(0)
    net = ActorCritic((4, 84, 84), 6, [512], "nature").to(device)
    frames = torch.randint(0, 256, (batch, 4, 84, 84), dtype=torch.uint8, device=device)
    bf16 = precision == "bf16"
    if device.type == "cpu" and bf16:
        raise ValueError("the layout row takes bf16 on CUDA only")
    last = nature_floats if device.type == "cpu" else (
        lambda obs: image_floats(obs.contiguous(memory_format=torch.channels_last)))

    def step(to_floats) -> None:
        net.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = net.shared(net.torso(to_floats(frames))).float().square().mean()
        loss.backward()

    sync = sync_of(device)
    r = Row(f"Nature CNN training pass, channels-last input, {device.type}" + (", bf16" if bf16 else ""),
            "s per pass", "channels-last", "stored layout", higher_is_better=False,
            target=1.0 if device.type == "cpu" else None,
            note=f"batch {batch} (IMPALA's 32 x 21 stacks), forward and backward of the torso and shared layer"
                 + ("" if device.type == "cpu" else "; the learners keep the stored layout on CUDA"))
    for _ in range(2):  # alternate, so drifts of the machine hit both
        r.values.setdefault("channels-last", []).extend(_seconds(lambda: step(last), reps, seconds, sync))
        r.values.setdefault("stored layout", []).extend(_seconds(lambda: step(image_floats), reps, seconds, sync))
    return r


def run(reps: int = MIN_REPS, seconds: float = 1.0, device: str = "all", layout_batch: int = LAYOUT_BATCH
        ) -> list[Row]:
    """``device``: "cpu", "cuda", or "all" (the CPU, and CUDA when torch sees it); ``layout_batch``: the stacks in
    the layout row's batch."""
    threads = torch.get_num_threads()
    cuda = [torch.device("cuda")] if torch.cuda.is_available() else []
    devices = {"cpu": [torch.device("cpu")], "cuda": cuda, "all": [torch.device("cpu")] + cuda}[device]
    if not devices:
        raise RuntimeError("no CUDA device: the learner bench on cuda needs one")
    rows = []
    try:
        torch.set_num_threads(min(2, threads))
        for device in devices:
            for label, obs, n_actions, hidden in SHAPES:
                rows.append(bench(label, obs, n_actions, hidden, device, reps, seconds))
            rows.append(layout(reps, seconds, layout_batch, device))
            if device.type == "cuda":
                rows.append(layout(reps, seconds, layout_batch, device, "bf16"))
    finally:
        torch.set_num_threads(threads)
    return rows
