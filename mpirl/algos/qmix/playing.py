"""QMIX's acting, in two halves that need no MPI: the games (:class:`Games`) and the decisions (:class:`Deciding`).

An actor without a worker holds both (:class:`mpirl.actor_learner.actor.Acting`). With inference workers (``topology.workers``)
the actor keeps only its :class:`Games` and sends each step's :class:`Outcome` to its worker, whose
:class:`Deciding` holds the agent network, each game's GRU state and episode being recorded, and the
staging of finished episodes for every actor it serves. The split is the same in both cases, so an
actor and a worker record the same episodes from the same games.

Per step of actor ``a``'s games: ``Deciding.observe(a, outcome)`` records what the last actions led to
(a finished episode is staged and its game restarts), then ``Deciding.act([a, ...], ...)`` picks the
next actions of every listed actor's games in one forward pass; ``Games.step(actions)`` plays them.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from mpirl.agents.qmix_policy import QMixPolicy, epsilon_schedule, explore
from mpirl.algos.qmix.envs import make
from mpirl.config import JobConfig
from mpirl.replay.ratio import InsertBudget
from mpirl.actor_learner.actor import insert_budget
from mpirl.actor_learner.experience import Staging
from mpirl.envs.outcomes import Outcome, count_failure

def step_spec(spaces) -> dict:
    """One game's row of an actor's step message: what its last actions led to and what to act on now.

    ``obs``/``avail``/``state``: the observation to act on (a restarted game's first one); ``reward``,
    ``terminated`` and ``ended`` (terminated, truncated or at the episode limit): the last step's outcome;
    ``final_*``: the observation the episode ended in (rows with ``ended`` only)."""
    n, obs, state = spaces.n_agents, tuple(spaces.obs_shape), tuple(spaces.state_shape)
    return {"obs": ((n, *obs), np.dtype(spaces.obs_dtype)), "avail": ((n, spaces.n_actions), np.dtype(np.bool_)),
            "state": (state, np.dtype(spaces.state_dtype)), "reward": ((), np.dtype(np.float32)),
            "terminated": ((), np.dtype(np.bool_)), "ended": ((), np.dtype(np.bool_)),
            "final_obs": ((n, *obs), np.dtype(spaces.obs_dtype)), "final_state": (state, np.dtype(spaces.state_dtype)),
            "final_avail": ((n, spaces.n_actions), np.dtype(np.bool_))}


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


class Games:
    """One actor's ``env.envs_per_actor`` games, stepped with the actions it is given; no policy, no MPI.

    A game that ends (terminated, truncated, or at the episode limit) restarts at once; its row of the
    outcome carries the final observation and the restarted game's first one."""

    def __init__(self, cfg: JobConfig, spaces, seed: int, label: str):
        self.cfg, self.label, self.seed = cfg, label, seed
        self.n = cfg.env.envs_per_actor
        self.spaces, self.limit = spaces, spaces.episode_limit
        spec = step_spec(spaces)
        self.out = {name: np.zeros((self.n, *shape), dtype) for name, (shape, dtype) in spec.items()}
        self.length = np.zeros(self.n, dtype=np.int64)
        self.env_errors = self.failing = 0
        self.envs: list = []

    def start(self) -> Outcome:
        """Build and reset every game (a rebuilt set gets seeds of its own)."""
        seed = self.seed + 7919 * self.env_errors
        self.envs = [make(self.cfg, seed + k, self.spaces) for k in range(self.n)]
        for key in ("reward", "terminated", "ended"):
            self.out[key][:] = 0
        for k, env in enumerate(self.envs):
            self._reset(k, seed=seed + k)
        return Outcome(self.out, fresh=True)

    def _reset(self, k: int, seed: int | None = None) -> None:
        o = self.out
        o["obs"][k], o["avail"][k], o["state"][k] = self.envs[k].reset(seed=seed)
        self.length[k] = 0

    def step(self, actions: np.ndarray) -> Outcome:
        """Play ``actions`` ``[n_games, n_agents]``; a game that raises rebuilds them all (``fresh``)."""
        o = self.out
        try:
            for k, env in enumerate(self.envs):
                r = env.step(actions[k])
                self.length[k] += 1
                ended = bool(r.terminated or r.truncated or self.length[k] >= self.limit)
                o["reward"][k], o["terminated"][k], o["ended"][k] = r.reward, r.terminated, ended
                if ended:
                    o["final_obs"][k], o["final_avail"][k], o["final_state"][k] = r.obs, r.mask, r.state
                    self._reset(k)
                else:
                    o["obs"][k], o["avail"][k], o["state"][k] = r.obs, r.mask, r.state
        except Exception as err:  # noqa: BLE001 - whatever a game raises, the actor rebuilds it and goes on
            return self.recover(err)
        self.failing = 0
        return Outcome(o, fresh=False)

    def recover(self, err: Exception) -> Outcome:
        """A game raised: say so, rebuild every game (their unfinished episodes are dropped)."""
        count_failure(self, err)
        self.close()
        return self.start()

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a broken env may not close cleanly either
                pass
        self.envs = []


class Deciding:
    """The agent network and the episodes being recorded for the games of ``actors`` actors; no MPI.

    Actor ``a``'s games are rows ``a*E .. a*E+E-1`` of the GRU state and the recorder. Each actor has its
    own random stream (``seeds[a]``) and epsilon schedule (over its own env steps), so the actions of an
    actor's games do not depend on which others share the forward pass."""

    def __init__(self, cfg: JobConfig, spaces, spec: dict, seeds: list[int]):
        self.cfg, self.spec = cfg, spec
        self.E = cfg.env.envs_per_actor
        self.actors = len(seeds)
        rows = self.actors * self.E
        self.rngs = [np.random.default_rng(s) for s in seeds]
        self.policy = QMixPolicy(spaces.n_agents, spaces.obs_shape, spaces.n_actions, cfg.qmix.rnn_hidden)
        self.policy.reset(rows)
        self.recorder = EpisodeRecorder(spec, rows)
        self.send_batch = cfg.comm.send_batch  # episodes per message
        self.staging = Staging(spec, cfg.comm.send_batch + rows)
        self.episodes: deque = deque()  # (return, length) of finished episodes not yet reported
        self.env_steps = np.zeros(self.actors, dtype=np.int64)
        self.returns = np.zeros(rows)
        self.actions = np.zeros((rows, spaces.n_agents), dtype=np.int64)
        self.started = np.zeros(self.actors, dtype=bool)
        self.frames = None  # episodes carry their observations: no frames once
        self.framed: dict = {}

    def rows(self, a: int) -> slice:
        return slice(a * self.E, (a + 1) * self.E)

    def budget(self, topo) -> InsertBudget:
        """The sender's flow control: its share of ``replay.samples_per_insert``'s budget."""
        return insert_budget(self.cfg, topo, self.staging)

    def holds(self, a: int) -> bool:
        """No actor waits for a round: each acts with the parameters it has."""
        return False

    def epsilon(self, a: int = 0) -> float:
        q = self.cfg.qmix
        return epsilon_schedule(int(self.env_steps[a]), q.epsilon_start, q.epsilon_finish, q.epsilon_anneal_steps)

    def observe(self, a: int, outcome: Outcome) -> None:
        """Record what actor ``a``'s last actions led to; finished episodes are staged, their games restart."""
        o, base, rec = outcome.rows, a * self.E, self.recorder
        if outcome.fresh or not self.started[a]:  # every game starts afresh (unfinished episodes dropped)
            for j in range(self.E):
                rec.start(base + j, o["obs"][j], o["avail"][j], o["state"][j])
            self.returns[self.rows(a)] = 0.0
            self.policy.reset_envs(self.rows(a))
            self.started[a] = True
            return
        restarted = []
        for j in range(self.E):
            k = base + j
            ended = bool(o["ended"][j])
            src = ("final_obs", "final_avail", "final_state") if ended else ("obs", "avail", "state")
            length = rec.record(k, self.actions[k], o["reward"][j], o["terminated"][j], *(o[f][j] for f in src))
            self.returns[k] += o["reward"][j]
            if ended:
                self.staging.put(rec.episode(k))
                self.episodes.append((float(self.returns[k]), length))
                rec.start(k, o["obs"][j], o["avail"][j], o["state"][j])
                self.returns[k] = 0.0
                restarted.append(k)
        self.env_steps[a] += self.E
        if restarted:
            self.policy.reset_envs(restarted)

    def act(self, actors: list[int], obs: np.ndarray, avail: np.ndarray) -> np.ndarray:
        """The next actions ``[len(actors)*E, n]`` of the listed actors' games, in one forward pass over their
        observations ``obs``/``avail`` (stacked in the same order); each actor explores with its own stream."""
        rows: slice | np.ndarray
        if len(actors) == self.actors and actors == list(range(self.actors)):
            rows = slice(None)
        else:
            rows = np.concatenate([np.arange(a * self.E, (a + 1) * self.E) for a in actors])
        actions = self.policy.greedy(obs, avail, rows)
        for i, a in enumerate(actors):
            part = slice(i * self.E, (i + 1) * self.E)
            actions[part] = explore(actions[part], avail[part], self.epsilon(a), self.rngs[a])
        self.policy.chose(actions, rows)
        self.actions[rows] = actions
        return actions

    def decide(self, actors: list[int], outcomes: list[Outcome]) -> np.ndarray:
        """:meth:`act` on the listed actors' latest outcomes (the inference worker's call)."""
        if len(outcomes) == 1:  # one actor (an actor without a worker): its games' rows as they are
            return self.act(actors, outcomes[0].rows["obs"], outcomes[0].rows["avail"])
        obs = np.concatenate([o.rows["obs"] for o in outcomes])
        avail = np.concatenate([o.rows["avail"] for o in outcomes])
        return self.act(actors, obs, avail)

    def take(self, rows: int) -> tuple[dict, np.ndarray]:
        """The first ``rows`` staged episodes (views) and their priorities (QMIX's replay has none: ones)."""
        return self.staging.take(rows), np.ones(rows, np.float32)

    def oldest_frame(self, rows: int) -> int:
        return 0

    def drop(self, rows: int) -> None:
        self.staging.drop(rows)

