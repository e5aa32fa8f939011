"""IMPALA's acting: the shared vector games (:mod:`mpirl.envs.games`) and the decisions (:class:`ImpalaDeciding`),
what IMPALA's builder (:mod:`mpirl.algos.impala.builder`) gives the actor loop (:mod:`mpirl.actor_learner.actor`).

The decisions sample each game's action from the actor's copy of the policy, and record each game's trajectory:
``impala.unroll`` steps with the behaviour policy's log-probability of the action actually taken, rewards,
terminated and truncated apart, the value of the final observation where a time limit truncated an episode, and
the parameter version the trajectory's first action was chosen with. All games of an actor step together, so their
trajectories end together and go in one message; the next ones start from the observation the last ended on.

A recurrent policy (``agent.recurrent = "lstm"``) carries each game's core state from step to step, zeroed where
an episode starts (or the games were rebuilt); each trajectory stores the state it started from and where its
episodes start, so the learner unrolls the same steps (:func:`mpirl.agents.actor_critic.impala_losses`). The state
is the actor's (or its inference worker's): a worker keeps one per game it serves.

The parameter broadcast carries the learner's version as one more value after the network's parameters
(:meth:`mpirl.algos.impala.learner.ImpalaTraining.flat_params`): that is how an actor knows the version it acts with.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from mpirl.agents.actor_critic_acting import actor_critic_acting
from mpirl.agents.sampling import log_prob, sample
from mpirl.algos.impala.flow import SenderWindow, queue_budget
from mpirl.config import JobConfig
from mpirl.replay.ratio import InsertBudget
from mpirl.actor_learner.experience import Staging
from mpirl.envs.outcomes import Outcome


def with_version(flat: np.ndarray, version: int) -> np.ndarray:
    """The broadcast's values: the network's float32 parameters, then ``version`` as the bits of an int32 (exact
    to 2**31 - 1; as a float32 value it would round past 2**24 versions). A broadcast moves bytes, never values."""
    return np.append(flat.astype(np.float32, copy=False), np.array([version], np.int32).view(np.float32))


def version_of(params: np.ndarray) -> int:
    return int(np.ascontiguousarray(params[-1:], dtype=np.float32).view(np.int32)[0])


class VersionedPolicy:
    """The actor's copy of the policy (:func:`~mpirl.agents.actor_critic_acting.actor_critic_acting`: numpy for a
    feed-forward MLP, torch otherwise), loaded from a broadcast whose last value is the learner's parameter version
    (:func:`with_version`)."""

    def __init__(self, obs_shape, action, agent_cfg, obs_dtype=None):
        self.inner = actor_critic_acting(obs_shape, action, agent_cfg, obs_dtype)
        self.n_params = self.inner.n_params  # the network's and the statistics' values, the version not counted
        self.state_size = self.inner.state_size
        self.version = 0

    @property
    def log_std(self) -> np.ndarray | None:
        return self.inner.log_std

    def load_flat(self, params: np.ndarray) -> None:
        self.version = version_of(params)
        self.inner.load_flat(params[:-1])

    def outputs(self, obs: np.ndarray) -> np.ndarray:
        return self.inner.outputs(obs)

    def step(self, obs, h, c, starts):
        return self.inner.step(obs, h, c, starts)

    def values(self, obs: np.ndarray, h: np.ndarray | None = None, c: np.ndarray | None = None) -> np.ndarray:
        return self.inner.values(obs, h, c)


class ImpalaDeciding:
    """The policy and the trajectories being recorded for the games of ``len(seeds)`` actors; no MPI."""

    def __init__(self, cfg: JobConfig, spaces, spec: dict, seeds: list[int], delays_us: list[float] | None = None):
        self.cfg, self.spec = cfg, spec
        self.E, self.actors, self.T = cfg.env.envs_per_actor, len(seeds), cfg.impala.unroll
        self.action = spaces.action
        self.policy = VersionedPolicy(spaces.obs_shape, spaces.action, cfg.agent, spaces.obs_dtype)
        self.rngs = [np.random.default_rng(s) for s in seeds]
        self.delays = [d * 1e-6 for d in (delays_us or [0.0] * self.actors)]  # seconds added to each step, per actor
        self.send_batch = self.E  # an actor's games finish their trajectories together: one message
        self.staging = Staging(spec, (self.actors + 1) * self.E)
        self.frames = None  # trajectories carry their observations: no frames once
        self.framed: dict = {}
        # The trajectories being recorded: actor a's games are rows a*E .. a*E+E-1.
        rows = self.actors * self.E
        self.traj = {name: np.zeros((rows, *shape), dtype) for name, (shape, dtype) in spec.items()}
        self.t = np.zeros(self.actors, dtype=np.int64)  # the step each actor's trajectories are at
        self.sync = cfg.impala.exchange == "sync"
        self.done_with = np.full(self.actors, -1, dtype=np.int64)  # the version of each actor's last trajectories
        self.started = np.zeros(self.actors, dtype=bool)
        # At each game's last decision: the policy's outputs (a categorical's log-probabilities) and the sampled
        # action's log-probability (a Gaussian's: nothing forces another action on a continuous game).
        self.out = np.zeros((rows, spaces.action.n_outputs))
        self.sampled_logp = np.zeros(rows, np.float32)
        self.episodes: deque = deque()
        self.env_steps = np.zeros(self.actors, dtype=np.int64)
        self.ep_return = np.zeros(rows)
        self.ep_length = np.zeros(rows, dtype=np.int64)
        # With agent.normalize_reward each game's discounted return of the recorded rewards, for the learner to count
        self.returns = np.zeros(rows) if "ret" in spec else None
        # A recurrent policy: each game's core state and whether its next observation starts an episode.
        H = self.policy.state_size
        self.h, self.c = np.zeros((rows, H), np.float32), np.zeros((rows, H), np.float32)
        self.starts = np.ones(rows, bool)
        self.recurrent = H > 0

    def rows(self, a: int) -> slice:
        return slice(a * self.E, (a + 1) * self.E)

    def epsilon(self, a: int = 0) -> float:
        return 0.0  # actions are sampled from the policy: no epsilon

    def budget(self, topo) -> InsertBudget | SenderWindow:
        """The sender's flow control (:mod:`mpirl.algos.impala.flow`): its window on its queue, grown by the queue as
        the learner takes its trajectories; in synchronous rounds, one message per version."""
        if self.cfg.impala.exchange == "sync":
            return queue_budget(self.cfg, topo.n_actors, len(topo.buffers), topo.group.size - 1)
        return SenderWindow(self.cfg, topo.group)

    def _begin(self, a: int, obs: np.ndarray) -> None:
        """Actor ``a``'s next trajectories start from ``obs`` (and a recurrent core from its games' state)."""
        r = self.rows(a)
        self.traj["obs"][r, 0] = obs
        if self.recurrent:
            self.traj["first"][r, 0] = self.starts[r]
            self.traj["h0"][r], self.traj["c0"][r] = self.h[r], self.c[r]
        self.t[a] = 0

    def observe(self, a: int, outcome: Outcome) -> None:
        """Record what actor ``a``'s last actions led to; finished trajectories are staged."""
        o, r, tr = outcome.rows, self.rows(a), self.traj
        if outcome.fresh or not self.started[a]:  # every game starts afresh (unfinished trajectories dropped)
            self.starts[r], self.h[r], self.c[r] = True, 0.0, 0.0
            self._begin(a, o["obs"])
            self.ep_return[r], self.ep_length[r] = 0.0, 0
            if self.returns is not None:
                self.returns[r] = 0.0
            self.started[a] = True
            return
        t, taken = int(self.t[a]), o["taken"]
        self.env_steps[a] += self.E
        clip = self.cfg.agent.reward_clip
        terminated = o["terminated"] | o["life_lost"]  # a lost life cuts the bootstrap where the env says so
        truncated = o["truncated"] & ~terminated
        tr["action"][r, t] = taken
        reward = np.clip(o["reward"], -clip, clip) if clip else o["reward"]
        tr["reward"][r, t] = reward * self.cfg.impala.reward_scale
        if self.returns is not None:
            self.returns[r] = self.returns[r] * self.cfg.agent.gamma + tr["reward"][r, t]
            tr["ret"][r, t] = self.returns[r]
            self.returns[r][o["terminated"] | o["truncated"]] = 0.0
        if self.action.continuous:
            tr["logp"][r, t] = self.sampled_logp[r]
        else:  # the action taken (a forced FIRE, say) under the policy it was decided with
            tr["logp"][r, t] = log_prob(self.action, self.out[r], None, taken)
        tr["terminated"][r, t], tr["truncated"][r, t] = terminated, truncated
        tr["final_value"][r, t] = 0.0
        if truncated.any():  # a time limit: the episode's final observation's value bootstraps (the episode's state)
            cut = np.flatnonzero(truncated) + r.start
            tr["final_value"][r, t][truncated] = self.policy.values(o["final_obs"][truncated], self.h[cut],
                                                                    self.c[cut])
        self.ep_return[r] += o["reward"]
        self.ep_length[r] += 1
        ended = o["terminated"] | o["truncated"]
        for k in np.flatnonzero(ended):
            self.episodes.append((float(self.ep_return[r][k]), int(self.ep_length[r][k])))
        self.ep_return[r][ended], self.ep_length[r][ended] = 0.0, 0
        tr["obs"][r, t + 1] = o["obs"]
        if self.recurrent:  # the next observation starts an episode: the core's state is zeroed before it
            self.starts[r] = ended
            tr["first"][r, t + 1] = ended
        if t + 1 < self.T:
            self.t[a] = t + 1
            return
        for row in range(r.start, r.stop):
            self.staging.put(tuple(arr[row] for arr in tr.values()))
        self.done_with[a] = tr["version"][r.start]
        self._begin(a, o["obs"])

    def holds(self, a: int) -> bool:
        """Synchronous rounds: actor ``a`` has finished this round's trajectories with the parameters loaded, and
        its next ones wait for the next parameters (an inference worker parks its request until they come)."""
        return self.sync and self.t[a] == 0 and self.done_with[a] == self.policy.version

    def decide(self, actors: list[int], outcomes: list[Outcome]) -> np.ndarray:
        """Actions for the listed actors' games from one forward pass; each actor samples with its own stream."""
        obs = outcomes[0].rows["obs"] if len(outcomes) == 1 else np.concatenate([o.rows["obs"] for o in outcomes])
        if self.recurrent:  # the listed games' states, one step on
            idx = np.concatenate([np.arange(self.rows(a).start, self.rows(a).stop) for a in actors])
            outputs, self.h[idx], self.c[idx] = self.policy.step(obs, self.h[idx], self.c[idx], self.starts[idx])
            self.starts[idx] = False
        else:
            outputs = self.policy.outputs(obs)
        out = np.empty((len(outputs), *self.action.shape), dtype=self.action.dtype)
        for i, a in enumerate(actors):
            if self.delays[a]:
                time.sleep(self.delays[a])
            part, r = slice(i * self.E, (i + 1) * self.E), self.rows(a)
            if self.t[a] == 0:  # a trajectory's first action: the version it is acted with (an actor of a
                self.traj["version"][r] = self.policy.version  # synchronous round has waited for it by now)
            self.out[r] = outputs[part]
            out[part], self.sampled_logp[r] = sample(self.action, outputs[part], self.policy.log_std, self.rngs[a])
        return out

    def take(self, rows: int) -> tuple[dict, np.ndarray]:
        return self.staging.take(rows), np.zeros(rows, np.float32)  # no priorities: a queue serves in order

    def oldest_frame(self, rows: int) -> int:
        return 0  # no frames once

    def drop(self, rows: int) -> None:
        self.staging.drop(rows)
