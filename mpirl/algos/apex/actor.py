"""The actor loop (Ape-X): step environments, build n-step transitions, ship them.

An actor waits for the first parameter broadcast, then acts epsilon-greedily
with an Ape-X epsilon per game (see ``env_epsilons``), accumulates n-step
transitions in a staging batch, computes their initial priorities with its local
network, and sends each full batch to its buffer with ``Isend`` from a ring of
preallocated buffers. New parameters are picked up between steps; the broadcast
with the stop flag ends the loop, and a final message tells the buffer this
actor is done.

:class:`Acting` is everything an actor does without MPI (games, policy, n-step
windows, priorities) and :class:`ExperienceSender` is its line to the buffer;
``mpirl bench actor`` runs the first with and without the second.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import torch

from mpirl.agents.dqn import ActingPolicy, env_epsilons
from mpirl.comm.backoff import Backoff
from mpirl.comm.messages import EPISODE_SLOTS, as_frame_ids
from mpirl.comm.params import ParamBroadcast, ParamFollower
from mpirl.config import JobConfig
from mpirl.envs.vector import make_vector, stacks_shift
from mpirl.replay.frame_stream import FrameStream
from mpirl.replay.frames import framed_fields
from mpirl.replay.nstep import NStepAccumulator
from mpirl.replay.ratio import InsertBudget
from mpirl.roles.context import RoleContext
from mpirl.roles.experience import ExperienceSender, Staging, oldest_frame
from mpirl.roles.steps import count_failure

class Acting:
    """One actor's games, local network and n-step windows; no MPI.

    ``step()`` plays one step of every game and stages the transitions that
    became complete; ``take(n)`` hands out the first n with their initial
    priorities (|TD| from the local network) and ``drop(n)`` forgets them.
    Finished episodes wait in ``episodes`` as (return, length).

    With frames once (Atari and ``replay.dedup_frames``), ``frames`` numbers each new frame once
    and the staged transitions hold their stacks as frame ids (``obs_fid``, ``next_obs_fid``).
    """

    def __init__(self, cfg: JobConfig, obs_shape: tuple, n_actions: int, spec: dict, epsilons: np.ndarray,
                 seed: int, label: str = "actor"):
        self.cfg = cfg
        self.label = label  # how messages name this actor, e.g. "actor rank 3"
        n_envs, n_step = cfg.env.envs_per_actor, cfg.apex.n_step
        self.epsilons = epsilons
        self.rng = np.random.default_rng(seed)
        self.policy = ActingPolicy(obs_shape, n_actions, cfg.agent)
        self.framed = framed_fields(spec) if cfg.replay.dedup_frames else {}
        self.frames = None
        if self.framed:  # one stream for the actor's life: a rebuild of its games goes on numbering
            depth, frame_shape = next(iter(self.framed.values()))
            self.frames = FrameStream(n_envs, depth, frame_shape, shifts=stacks_shift(cfg.env))
        # Each env step emits at most n transitions (on episode end), so this never overflows.
        self.staging = Staging(as_frame_ids(spec, self.framed), cfg.comm.send_batch + n_envs * n_step)
        self.episodes: deque = deque()
        self.env_steps = 0
        self.seed = seed
        self.envs = None
        self.env_errors = 0  # failures inside the games, each followed by a rebuild
        self.failing = 0  # failures since the last good step

    def start(self) -> None:
        """Build and reset the games (after the first parameters arrived)."""
        cfg = self.cfg
        n_envs = cfg.env.envs_per_actor
        # A rebuilt set of games gets a seed of its own: the same seed would replay the same failure.
        self.envs = make_vector(cfg.env, seed=self.seed + 7919 * self.env_errors)
        self.obs = self.envs.reset()
        if self.frames is not None:
            self.obs_ids = [self.frames.start(k, self.obs[k]) for k in range(n_envs)]
        self.nsteps = [NStepAccumulator(cfg.apex.n_step, cfg.agent.gamma) for _ in range(n_envs)]
        self.ep_return, self.ep_length = np.zeros(n_envs), np.zeros(n_envs, dtype=np.int64)

    def step(self) -> None:
        envs, clip = self.envs, self.cfg.agent.reward_clip
        actions = envs.forced(self.policy.act(self.obs, self.epsilons, self.rng))
        try:
            step = envs.step(actions)
        except Exception as err:  # noqa: BLE001 - whatever a game raises, the actor rebuilds it and goes on
            self.recover(err)
            return
        self.failing = 0
        self.env_steps += envs.num_envs
        self.ep_return += step.reward
        self.ep_length += 1
        rewards = np.clip(step.reward, -clip, clip) if clip else step.reward
        ended = step.terminated | step.truncated
        cut = step.terminated if step.life_lost is None else step.terminated | step.life_lost
        frames = self.frames
        for k in range(envs.num_envs):
            # The step's arrays are fresh: the n-step windows may keep views of their rows.
            obs, last = self.obs[k], step.final_obs[k]
            if frames is not None:  # the stacks as frame ids: each new frame numbered once
                obs, last = self.obs_ids[k], frames.advance(k, last)
                self.obs_ids[k] = frames.start(k, step.obs[k]) if ended[k] else last
            for transition in self.nsteps[k].push(obs, actions[k], rewards[k], last, cut[k], step.truncated[k]):
                self.staging.put(transition)
            if ended[k]:
                self.episodes.append((float(self.ep_return[k]), int(self.ep_length[k])))
        self.ep_return[ended], self.ep_length[ended] = 0.0, 0
        self.obs = step.obs

    def recover(self, err: Exception) -> None:
        """A game raised: say so, rebuild every game of this actor, drop the unfinished episodes.

        The n-step windows of the broken episodes are dropped (their transitions would
        bootstrap from a state that never came); the episodes are not reported. After
        ``roles.steps.MAX_FAILING`` failures in a row without one good step, the error is raised:
        the actor cannot make progress, and the job ends naming it.
        """
        count_failure(self, err)
        try:
            self.envs.close()
        except Exception:  # noqa: BLE001 - a broken env may not close cleanly either
            pass
        self.start()

    @property
    def staged(self) -> int:
        return self.staging.count

    def take(self, rows: int) -> tuple[dict, np.ndarray]:
        """The first ``rows`` staged transitions (views) and their initial priorities."""
        records = self.staging.take(rows)
        if not rows:
            return records, np.zeros(0, np.float32)
        batch = records if self.frames is None else self.frames.batch(records, self.framed)
        return records, self.policy.priorities(batch)

    def oldest_frame(self, rows: int) -> int:
        """With frames once: the oldest frame a later message may refer to, once ``rows`` staged rows are sent."""
        return 0 if self.frames is None else oldest_frame(self.frames, self.staging, rows, self.nsteps)

    def drop(self, rows: int) -> None:
        self.staging.drop(rows)

    def close(self) -> None:
        if self.envs is not None:
            self.envs.close()


def run_actor(ctx: RoleContext) -> None:
    cfg, topo = ctx.cfg, ctx.topo
    torch.set_num_threads(1)
    n_envs, batch = cfg.env.envs_per_actor, cfg.comm.send_batch
    epsilons = env_epsilons(topo.actor_index, topo.n_actors, n_envs, cfg.apex.epsilon, cfg.apex.epsilon_alpha)
    epsilon = float(epsilons.mean())  # reported: the mean over this actor's games
    acting = Acting(cfg, ctx.spaces.obs_shape, ctx.spaces.n_actions, ctx.spec, epsilons, ctx.seed(), label=f"actor rank {topo.rank}")
    if ctx.resume:  # count on from this actor's last recorded steps before the checkpoint
        acting.env_steps = ctx.resume.actor_steps.get(topo.rank, 0)
    steps_before = acting.env_steps
    sender = ExperienceSender(topo.group, ctx.spec, batch, cfg.comm.send_ring, topo.rank, acting.frames, acting.framed)
    params = ParamFollower(ParamBroadcast(topo.group_params, acting.policy.n_params), acting.policy.load_flat)
    throttled = 0.0
    rp = cfg.replay
    budget = InsertBudget(rp.samples_per_insert, rp.batch_size, cfg.comm.n_update, topo.n_actors,
                          rp.learning_starts, len(topo.buffers), topo.group.size - 1,
                          slack=batch + n_envs * cfg.apex.n_step)

    def send(rows: int, final: bool = False) -> None:
        records, priorities = acting.take(rows)
        elapsed = max(time.perf_counter() - started, 1e-9)
        sender.send(records, priorities, acting.episodes, final=final, oldest=acting.oldest_frame(rows),
                    env_steps=acting.env_steps,
                    param_version=params.version, epsilon=epsilon, steps_per_s=(acting.env_steps - steps_before) / elapsed,
                    throttled_s=throttled, env_errors=acting.env_errors)
        acting.drop(rows)

    params.start()  # the first parameters (or the stop): the insert budget counts from params.first
    acting.start()
    started = time.perf_counter()
    waiting = Backoff(first=1e-4, longest=10e-3)

    # New parameters are looked for once per message sent (and while held back), not every step: with more
    # ranks than cores Open MPI yields the CPU inside every test of a broadcast, and an actor testing each
    # step ran several times slower than its twin. The learner's share of the CPU is the insert budget's.
    look = True
    while not params.stopped:
        if look:
            look = False
            if params.poll():
                waiting.reset()
                if params.stopped:
                    break
        ctx.preempt.requested()  # a signal here: tell the learner, which stops the job
        if budget.over(sender.sent, params.version - params.first + 1):  # ahead of the learner: sleep until it publishes again
            t0 = time.perf_counter()
            waiting.sleep()
            throttled += time.perf_counter() - t0
            look = True
            continue
        acting.step()
        while acting.staged >= batch:
            send(batch)
            look = True
        if sender.frames_due:  # frames of games that have not made transitions yet (e.g. short episodes)
            send(min(acting.staged, batch))
            look = True

    # Unsent transitions are dropped: the learner has stopped. Report episodes, then say goodbye.
    acting.drop(acting.staged)
    while len(acting.episodes) > EPISODE_SLOTS:
        send(0)
    send(0, final=True)
    sender.close()
    acting.close()
