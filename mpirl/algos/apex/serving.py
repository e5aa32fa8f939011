"""Ape-X's acting, in two halves that need no MPI: the games (:class:`ApexGames`) and the decisions
(:class:`ApexDeciding`); what Ape-X's builder (:mod:`mpirl.algos.apex.builder`) gives the actor loop (:mod:`mpirl.actor_learner.actor`), an inference worker
(:mod:`mpirl.actor_learner.worker`) and the actors it serves (:mod:`mpirl.actor_learner.env_actor`): SEED RL's layout.

The games are the vector env, the forced actions such as FIRE after a life loss and the rebuild after a
failure; per step they give what the last actions led to: the action actually taken, the reward,
terminated / truncated / life lost, the final observation of an episode that ended and the observation to
act on now. The decisions hold the network, each actor's Ape-X epsilons (one per game, by the actor's index
among all actors) and random stream, the n-step windows, the staging, and compute the initial priorities.
An actor without a worker holds both for itself (:class:`mpirl.actor_learner.actor.Acting`); with inference workers
(``topology.workers``) the actor keeps only its games and its worker decides for several actors, so an actor
and a worker record the same transitions from the same games.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from mpirl.agents.acting import acting_policy
from mpirl.agents.exploration import env_epsilons, explore
from mpirl.config import JobConfig
from mpirl.comm.messages import as_frame_ids
from mpirl.envs.vector import stacks_shift
from mpirl.replay.frame_stream import FrameStream
from mpirl.replay.frames import framed_fields
from mpirl.replay.nstep import NStepAccumulator
from mpirl.replay.ratio import InsertBudget
from mpirl.actor_learner.actor import insert_budget
from mpirl.actor_learner.experience import Staging, oldest_frame
from mpirl.envs.games import VectorGames
from mpirl.envs.outcomes import Outcome

ApexGames = VectorGames  # an Ape-X actor's games: the shared vector games



class ApexDeciding:
    """The network, epsilons, n-step windows and staging for the games of several actors; no MPI.

    ``indices``: each actor's index among all ``n_actors`` actors of the job (its Ape-X epsilons)."""

    def __init__(self, cfg: JobConfig, spaces, spec: dict, seeds: list[int], indices: list[int], n_actors: int):
        a = cfg.agent
        self.cfg, self.E, self.actors = cfg, cfg.env.envs_per_actor, len(seeds)
        self.policy = acting_policy(spaces.obs_shape, spaces.n_actions, a)
        self.n_actions = spaces.n_actions
        self.epsilons = [env_epsilons(i, n_actors, self.E, cfg.apex.epsilon, cfg.apex.epsilon_alpha) for i in indices]
        self.rngs = [np.random.default_rng(s) for s in seeds]
        # Frames once (Atari and replay.dedup_frames): one stream for all the games served, game a * E + k.
        self.framed = framed_fields(spec) if cfg.replay.dedup_frames else {}
        self.frames = None
        if self.framed:
            depth, frame_shape = next(iter(self.framed.values()))
            self.frames = FrameStream(self.actors * self.E, depth, frame_shape, shifts=stacks_shift(cfg.env))
        self.send_batch = cfg.comm.send_batch  # transitions per message
        self.staging = Staging(as_frame_ids(spec, self.framed), cfg.comm.send_batch + self.actors * self.E * cfg.apex.n_step)
        self.episodes: deque = deque()
        self.env_steps = np.zeros(self.actors, dtype=np.int64)
        # Each game's obs to act on (with frames once: its frame ids).
        self.current: list[list] = [[None] * self.E for _ in range(self.actors)]
        self.nsteps = [[NStepAccumulator(cfg.apex.n_step, a.gamma) for _ in range(self.E)] for _ in range(self.actors)]
        self.ep_return = np.zeros((self.actors, self.E))
        self.ep_length = np.zeros((self.actors, self.E), dtype=np.int64)

    def holds(self, a: int) -> bool:
        """No actor waits for a round: each acts with the parameters it has."""
        return False

    def epsilon(self, a: int = 0) -> float:
        return float(self.epsilons[a].mean())

    def budget(self, topo) -> InsertBudget:
        """The sender's flow control: its share of ``replay.samples_per_insert``'s budget."""
        return insert_budget(self.cfg, topo, self.staging)

    def observe(self, a: int, outcome: Outcome) -> None:
        """Record what actor ``a``'s last actions led to: its n-step transitions become complete and are staged."""
        o = outcome.rows
        frames, first = self.frames, a * self.E
        if outcome.fresh or self.current[a][0] is None:
            self.current[a] = [o["obs"][k].copy() if frames is None else frames.start(first + k, o["obs"][k])
                               for k in range(self.E)]
            self.nsteps[a] = [NStepAccumulator(self.cfg.apex.n_step, self.cfg.agent.gamma) for _ in range(self.E)]
            self.ep_return[a], self.ep_length[a] = 0.0, 0
            return
        clip = self.cfg.agent.reward_clip
        self.env_steps[a] += self.E
        self.ep_return[a] += o["reward"]
        self.ep_length[a] += 1
        rewards = np.clip(o["reward"], -clip, clip) if clip else o["reward"]
        ended = o["terminated"] | o["truncated"]
        cut = o["terminated"] | o["life_lost"]
        for k in range(self.E):
            if frames is not None:  # the stacks as frame ids: each new frame numbered once
                last = frames.advance(first + k, o["final_obs"][k])
                now = frames.start(first + k, o["obs"][k]) if ended[k] else last
            else:  # the windows keep their observations by reference: each is a copy of its own
                now = o["obs"][k].copy()
                last = o["final_obs"][k].copy() if ended[k] else now
            for transition in self.nsteps[a][k].push(self.current[a][k], o["taken"][k], rewards[k], last, cut[k],
                                                     o["truncated"][k]):
                self.staging.put(transition)
            if ended[k]:
                self.episodes.append((float(self.ep_return[a, k]), int(self.ep_length[a, k])))
            self.current[a][k] = now
        self.ep_return[a][ended], self.ep_length[a][ended] = 0.0, 0

    def decide(self, actors: list[int], outcomes: list[Outcome]) -> np.ndarray:
        """Actions for the listed actors' games, one forward pass; each actor explores with its own stream."""
        obs = outcomes[0].rows["obs"] if len(outcomes) == 1 else np.concatenate([o.rows["obs"] for o in outcomes])
        greedy = self.policy.greedy(obs)
        out = np.empty(len(greedy), dtype=np.int64)
        for i, a in enumerate(actors):
            part = slice(i * self.E, (i + 1) * self.E)
            out[part] = explore(greedy[part], self.epsilons[a], self.rngs[a], self.n_actions)
        return out

    def take(self, rows: int) -> tuple[dict, np.ndarray]:
        records = self.staging.take(rows)
        if not rows:
            return records, np.zeros(0, np.float32)
        return records, self.policy.priorities(records if self.frames is None else self.frames.batch(records, self.framed))

    def oldest_frame(self, rows: int) -> int:
        """With frames once: the oldest frame a later message may refer to, once ``rows`` staged rows are sent."""
        if self.frames is None:
            return 0
        return oldest_frame(self.frames, self.staging, rows, [w for ws in self.nsteps for w in ws])

    def drop(self, rows: int) -> None:
        self.staging.drop(rows)
