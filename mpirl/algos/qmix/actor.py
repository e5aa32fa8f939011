"""The QMIX actor: play ``env.envs_per_actor`` multi-agent games with its copy of the agent network, ship
whole episodes.

Like the Ape-X actor it waits for the first parameter broadcast, picks up newer ones between steps,
and stops on the broadcast that carries the stop flag. Each game's episode is recorded into
preallocated ``[T+1, ...]`` arrays (:class:`EpisodeRecorder`); a finished episode is copied into the
staging rows and every ``comm.send_batch`` episodes go to the buffer in one message (the Ape-X
experience layout over the episode spec, with the episodes' returns in its header). Exploration:
epsilon falls linearly from ``qmix.epsilon_start`` to ``epsilon_finish`` over the actor's env steps.
"""

from __future__ import annotations

import sys
import time
from collections import deque

import numpy as np
import torch

from mpirl.agents.qmix import QMixPolicy, epsilon_schedule
from mpirl.algos.qmix.envs import make
from mpirl.comm.backoff import Backoff, wait_until
from mpirl.comm.messages import EPISODE_SLOTS
from mpirl.comm.params import ParamBroadcast
from mpirl.replay.ratio import InsertBudget
from mpirl.roles.context import RoleContext
from mpirl.roles.experience import ExperienceSender, Staging

MAX_FAILING = 10  # failures of the games in a row, without a good step between, before the actor gives up


class EpisodeRecorder:
    """The episodes of ``n`` games as they are played: per game one ``[T+1, ...]`` array per spec field."""

    def __init__(self, spec: dict, n: int):
        self.rows = {name: np.zeros((n, *shape), dtype) for name, (shape, dtype) in spec.items()}
        self.t = np.zeros(n, dtype=np.int64)
        self.limit = spec["filled"][0][0] - 1  # T

    def start(self, k: int, obs, avail, state) -> None:
        r, t = self.rows, int(self.t[k])
        for arr in r.values():  # rows 0..t were written by the last episode of this game
            arr[k, :t + 1] = 0
        r["obs"][k, 0], r["avail"][k, 0], r["state"][k, 0] = obs, avail, state
        self.t[k] = 0

    def record(self, k: int, action, reward: float, terminated: bool, obs, avail, state) -> int:
        """Step t of game k: the action taken, then what it led to (row t + 1); returns the new length."""
        r, t = self.rows, int(self.t[k])
        r["actions"][k, t], r["reward"][k, t], r["terminated"][k, t], r["filled"][k, t] = (
            action, reward, terminated, True)
        r["obs"][k, t + 1], r["avail"][k, t + 1], r["state"][k, t + 1] = obs, avail, state
        self.t[k] = t + 1
        return t + 1

    def episode(self, k: int) -> tuple:
        """Game k's episode as the staging row tuple (spec order)."""
        return tuple(arr[k] for arr in self.rows.values())


class Playing:
    """One actor's games and policy; no MPI. ``step()`` plays one step of every game."""

    def __init__(self, ctx: RoleContext, label: str):
        cfg, s = ctx.cfg, ctx.spaces
        self.cfg, self.label, self.spec = cfg, label, ctx.spec
        self.n = cfg.env.envs_per_actor
        self.seed = ctx.seed()
        self.rng = np.random.default_rng(self.seed)
        self.policy = QMixPolicy(s.n_agents, s.obs_shape, s.n_actions, cfg.qmix.rnn_hidden)
        self.recorder = EpisodeRecorder(ctx.spec, self.n)
        self.staging = Staging(ctx.spec, cfg.comm.send_batch + self.n)
        self.episodes: deque = deque()  # (return, length) of finished episodes not yet reported
        self.env_steps = 0
        self.env_errors = self.failing = 0
        self.envs: list = []

    def epsilon(self) -> float:
        q = self.cfg.qmix
        return epsilon_schedule(self.env_steps, q.epsilon_start, q.epsilon_finish, q.epsilon_anneal_steps)

    def start(self) -> None:
        seed = self.seed + 7919 * self.env_errors  # a rebuilt set of games gets seeds of its own
        self.envs = [make(self.cfg, seed + k) for k in range(self.n)]
        self.obs = np.zeros((self.n, *self.spec["obs"][0][1:]), self.spec["obs"][1])
        self.avail = np.zeros((self.n, *self.spec["avail"][0][1:]), bool)
        self.returns = np.zeros(self.n)
        for k, env in enumerate(self.envs):
            self._reset(k, seed=seed + k)
        self.policy.reset(self.n)

    def _reset(self, k: int, seed: int | None = None) -> None:
        obs, avail, state = self.envs[k].reset(seed=seed)
        self.obs[k], self.avail[k] = obs, avail
        self.recorder.start(k, obs, avail, state)
        self.returns[k] = 0.0

    def step(self) -> None:
        actions = self.policy.act(self.obs, self.avail, self.epsilon(), self.rng)
        restarted = []
        try:
            for k, env in enumerate(self.envs):
                out = env.step(actions[k])
                length = self.recorder.record(k, actions[k], out.reward, out.terminated, out.obs, out.mask,
                                              out.state)
                self.returns[k] += out.reward
                self.obs[k], self.avail[k] = out.obs, out.mask
                if out.terminated or out.truncated or length >= self.recorder.limit:
                    self.staging.put(self.recorder.episode(k))
                    self.episodes.append((float(self.returns[k]), length))
                    self._reset(k)
                    restarted.append(k)
        except Exception as err:  # noqa: BLE001 - whatever a game raises, the actor rebuilds it and goes on
            self.recover(err)
            return
        self.failing = 0
        self.env_steps += self.n
        if restarted:
            self.policy.reset_envs(restarted)

    def recover(self, err: Exception) -> None:
        """A game raised: say so, rebuild every game (their unfinished episodes are dropped)."""
        self.env_errors += 1
        self.failing += 1
        print(f"mpirl: {self.label}: {self.cfg.env.id} raised {type(err).__name__}: {err}; "
              f"rebuilding its environments (failure {self.env_errors})", file=sys.stderr, flush=True)
        if self.failing >= MAX_FAILING:
            raise RuntimeError(f"{self.cfg.env.id} failed {self.failing} times in a row on {self.label}; "
                               "giving up") from err
        self.close()
        self.start()

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a broken env may not close cleanly either
                pass
        self.envs = []


def run_actor(ctx: RoleContext) -> None:
    cfg, topo = ctx.cfg, ctx.topo
    torch.set_num_threads(1)
    batch = cfg.comm.send_batch
    playing = Playing(ctx, label=f"actor rank {topo.rank}")
    if ctx.resume:  # count on from this actor's last recorded steps before the checkpoint
        playing.env_steps = ctx.resume.actor_steps.get(topo.rank, 0)
    steps_before = playing.env_steps
    sender = ExperienceSender(topo.group, ctx.spec, batch, cfg.comm.send_ring, topo.rank)
    params = ParamBroadcast(topo.group_params, ctx.n_params)
    version, throttled = -1, 0.0
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
                    env_steps=playing.env_steps, param_version=version, epsilon=playing.epsilon(),
                    steps_per_s=(playing.env_steps - steps_before) / elapsed, throttled_s=throttled,
                    env_errors=playing.env_errors)
        playing.staging.drop(rows)

    params.post()
    wait_until(params.arrived, first=1e-4, longest=10e-3)
    stopped = params.stop
    first = params.version  # 1, or a resumed learner's version: the insert budget counts from here
    if not stopped:
        playing.policy.load_flat(params.params)
        version = params.version
        params.post()
    playing.start()
    started = time.perf_counter()
    waiting = Backoff(first=1e-4, longest=10e-3)
    while not stopped:
        if params.arrived():
            stopped = params.stop
            if stopped:
                break
            playing.policy.load_flat(params.params)
            version = params.version
            params.post()
        ctx.preempt.requested()  # a signal here: tell the learner, which stops the job
        if budget.over(sender.sent + playing.staging.count, version - first + 1):
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
