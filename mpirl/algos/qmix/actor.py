"""The QMIX actor: play ``env.envs_per_actor`` multi-agent games with its copy of the agent network, ship
whole episodes (without inference workers; with them, see :mod:`mpirl.roles.worker`).

Like the Ape-X actor it waits for the first parameter broadcast, picks up newer ones between steps,
and stops on the broadcast that carries the stop flag. Each game's episode is recorded into
preallocated ``[T+1, ...]`` arrays (:class:`~mpirl.algos.qmix.playing.EpisodeRecorder`); a finished episode is copied into the
staging rows and every ``comm.send_batch`` episodes go to the buffer in one message (the Ape-X
experience layout over the episode spec, with the episodes' returns in its header). Exploration:
epsilon falls linearly from ``qmix.epsilon_start`` to ``epsilon_finish`` over the actor's env steps.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from mpirl.algos.qmix.playing import Playing
from mpirl.comm.backoff import Backoff
from mpirl.comm.messages import EPISODE_SLOTS
from mpirl.comm.params import ParamBroadcast, ParamFollower
from mpirl.replay.ratio import InsertBudget
from mpirl.roles.context import RoleContext
from mpirl.roles.experience import ExperienceSender


def run_actor(ctx: RoleContext) -> None:
    cfg, topo = ctx.cfg, ctx.topo
    torch.set_num_threads(1)
    batch = cfg.comm.send_batch
    playing = Playing(cfg, ctx.spaces, ctx.spec, ctx.seed(), label=f"actor rank {topo.rank}")
    if ctx.resume:  # count on from this actor's last recorded steps before the checkpoint
        playing.env_steps = ctx.resume.actor_steps.get(topo.rank, 0)
    steps_before = playing.env_steps
    sender = ExperienceSender(topo.group, ctx.spec, batch, cfg.comm.send_ring, topo.rank)
    params = ParamFollower(ParamBroadcast(topo.group_params, ctx.n_params), playing.policy.load_flat)
    throttled = 0.0
    rp = cfg.replay
    # replay.samples_per_insert: each episode is trained on about that many times; the actors wait for the
    # learner instead of taking the CPU it needs (on a few shared cores the learner is the bottleneck).
    budget = InsertBudget(rp.samples_per_insert, rp.batch_size, cfg.comm.n_update, topo.n_actors,
                          rp.learning_starts, len(topo.buffers), topo.group.size - 1,
                          slack=batch + playing.n)

    def send(rows: int, final: bool = False) -> None:
        records = playing.staging.take(rows)
        elapsed = max(time.perf_counter() - started, 1e-9)
        sender.send(records, np.ones(rows, np.float32), playing.episodes, final=final,
                    env_steps=playing.env_steps, param_version=params.version, epsilon=playing.epsilon(),
                    steps_per_s=(playing.env_steps - steps_before) / elapsed, throttled_s=throttled,
                    env_errors=playing.env_errors)
        playing.staging.drop(rows)

    params.start()  # the first parameters (or the stop): the insert budget counts from params.first
    playing.start()
    started = time.perf_counter()
    waiting = Backoff(first=1e-4, longest=10e-3)
    while not params.stopped:
        if params.poll() and params.stopped:
            break
        ctx.preempt.requested()  # a signal here: tell the learner, which stops the job
        if budget.over(sender.sent + playing.staging.count, params.version - params.first + 1):
            t0 = time.perf_counter()
            waiting.sleep()
            throttled += time.perf_counter() - t0
            continue
        waiting.reset()
        playing.step()
        while playing.staging.count >= batch:
            send(batch)
    # Unsent episodes are dropped: the learner has stopped. Report their returns, then say goodbye.
    playing.staging.drop(playing.staging.count)
    while len(playing.episodes) > EPISODE_SLOTS:
        send(0)
    send(0, final=True)
    sender.close()
    playing.close()
