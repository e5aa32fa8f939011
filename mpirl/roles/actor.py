"""The actor loop (Ape-X): step environments, build n-step transitions, ship them.

An actor waits for the first parameter broadcast, then acts epsilon-greedily
with an Ape-X epsilon per game (see ``env_epsilons``), accumulates n-step transitions in a staging batch,
computes their initial priorities with its local network, and sends each full
batch to its buffer with ``Isend`` from a ring of preallocated buffers. New
parameters are picked up between steps; the broadcast with the stop flag ends
the loop, and a final message tells the buffer this actor is done.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import torch

from mpirl.agents.dqn import ActingPolicy, env_epsilons
from mpirl.comm.backoff import Backoff, wait_until
from mpirl.comm.messages import EPISODE_SLOTS, TAG_EXPERIENCE, experience_layout
from mpirl.comm.params import ParamBroadcast
from mpirl.comm.pools import SendRing
from mpirl.envs.vector import make_vector
from mpirl.replay.nstep import NStepAccumulator
from mpirl.replay.ratio import InsertBudget
from mpirl.roles.context import RoleContext


class Staging:
    """Transitions waiting to be sent: one preallocated array per field."""

    def __init__(self, spec: dict, rows: int):
        self.fields = {name: np.zeros((rows, *shape), dtype) for name, (shape, dtype) in spec.items()}
        self.count = 0

    def put(self, transition: tuple) -> None:
        obs, action, ret, next_obs, done, discount = transition
        i, f = self.count, self.fields
        f["obs"][i], f["action"][i], f["reward"][i] = obs, action, ret
        f["next_obs"][i], f["done"][i], f["discount"][i] = next_obs, done, discount
        self.count += 1

    def take(self, n: int) -> dict:
        """Views of the first ``n`` rows (valid until ``drop(n)``)."""
        return {name: arr[:n] for name, arr in self.fields.items()}

    def drop(self, n: int) -> None:
        """Forget the first ``n`` rows, moving the rest to the front."""
        rest = self.count - n
        if rest:
            for arr in self.fields.values():
                arr[:rest] = arr[n:self.count]
        self.count = rest


def run_actor(ctx: RoleContext) -> None:
    cfg, topo = ctx.cfg, ctx.topo
    torch.set_num_threads(1)
    n_envs, batch = cfg.env.envs_per_actor, cfg.comm.send_batch
    epsilons = env_epsilons(topo.actor_index, topo.n_actors, n_envs, cfg.agent.epsilon, cfg.agent.epsilon_alpha)
    epsilon = float(epsilons.mean())  # reported: the mean over this actor's games
    rng = np.random.default_rng(ctx.seed())
    policy = ActingPolicy(ctx.obs_shape, ctx.n_actions, cfg.agent)
    layout = experience_layout(ctx.spec, batch)
    ring = SendRing(topo.group, dest=0, tag=TAG_EXPERIENCE, nbytes=layout.max_nbytes, size=cfg.comm.send_ring)
    params = ParamBroadcast(topo.group_params, policy.n_params)
    # Each env step emits at most n transitions (on episode end), so this never overflows.
    staging = Staging(ctx.spec, batch + n_envs * cfg.agent.n_step)
    episodes: deque = deque()  # (return, length) not yet reported
    env_steps, version, sent, throttled = 0, -1, 0, 0.0
    rp = cfg.replay
    budget = InsertBudget(rp.samples_per_insert, rp.batch_size, cfg.comm.n_update, topo.n_actors,
                          rp.learning_starts, len(topo.buffers), topo.group.size - 1,
                          slack=batch + n_envs * cfg.agent.n_step)

    def send(rows: int, final: bool = False) -> None:
        nonlocal sent
        slot, buf = ring.acquire()
        records = staging.take(rows)
        priorities = policy.priorities(records) if rows else np.zeros(0, np.float32)
        k = min(len(episodes), EPISODE_SLOTS)
        done_eps = [episodes.popleft() for _ in range(k)]
        elapsed = max(time.perf_counter() - started, 1e-9)
        nbytes = layout.pack(buf, {**records, "priority": priorities}, actor=topo.rank, env_steps=env_steps,
                             param_version=version, epsilon=epsilon, steps_per_s=env_steps / elapsed,
                             throttled_s=throttled, final=int(final), episodes=k, ep_return=[r for r, _ in done_eps],
                             ep_length=[n for _, n in done_eps])
        ring.send(slot, nbytes)
        staging.drop(rows)
        sent += rows

    params.post()
    wait_until(params.arrived, first=1e-4, longest=10e-3)
    stopped = params.stop
    if not stopped:
        policy.load_flat(params.params)
        version = params.version
        params.post()

    envs = make_vector(cfg.env, seed=ctx.seed())
    obs = envs.reset()
    nsteps = [NStepAccumulator(cfg.agent.n_step, cfg.agent.gamma) for _ in range(n_envs)]
    ep_return, ep_length = np.zeros(n_envs), np.zeros(n_envs, dtype=np.int64)
    clip = cfg.agent.reward_clip
    started = time.perf_counter()
    waiting = Backoff(first=1e-4, longest=10e-3)

    while not stopped:
        if params.arrived():
            waiting.reset()
            stopped = params.stop
            if stopped:
                break
            policy.load_flat(params.params)
            version = params.version
            params.post()
        if budget.over(sent, version):  # ahead of the learner: sleep until it publishes again
            t0 = time.perf_counter()
            waiting.sleep()
            throttled += time.perf_counter() - t0
            continue
        actions = envs.forced(policy.act(obs, epsilons, rng))
        step = envs.step(actions)
        env_steps += n_envs
        ep_return += step.reward
        ep_length += 1
        rewards = np.clip(step.reward, -clip, clip) if clip else step.reward
        ended = step.terminated | step.truncated
        cut = step.terminated if step.life_lost is None else step.terminated | step.life_lost
        for k in range(n_envs):
            # The step's arrays are fresh: the n-step windows may keep views of their rows.
            for transition in nsteps[k].push(obs[k], actions[k], rewards[k], step.final_obs[k],
                                             cut[k], step.truncated[k]):
                staging.put(transition)
            if ended[k]:
                episodes.append((float(ep_return[k]), int(ep_length[k])))
        ep_return[ended], ep_length[ended] = 0.0, 0
        obs = step.obs
        while staging.count >= batch:
            send(batch)

    # Unsent transitions are dropped: the learner has stopped. Report episodes, then say goodbye.
    staging.count = 0
    while len(episodes) > EPISODE_SLOTS:
        send(0)
    send(0, final=True)
    ring.close()
    envs.close()
