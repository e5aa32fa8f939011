"""The actor loop of the replay-based algorithms: play the games, ship what the decisions staged.

An actor is two parts its algorithm's builder (:class:`~mpirl.actor_learner.builder.ActorLearnerBuilder`) makes,
the same two an inference worker (:mod:`mpirl.actor_learner.worker`) and the actors it serves
(:mod:`mpirl.actor_learner.env_actor`) split between them: the games
(:class:`~mpirl.actor_learner.builder.Games`: the environments, stepped with the actions they are given) and the
decisions (:class:`~mpirl.actor_learner.builder.Deciding`: the network, exploration, and what the outcomes make,
staged for the buffer).

:class:`Acting` holds both for one actor, without MPI (``mpirl bench actor`` runs it with and without the
sending). :func:`run_actor` is the loop around it: it waits for the first parameter broadcast, steps the
games, sends each full batch to its buffer with ``Isend`` from a ring of preallocated buffers, keeps within
the insert budget, picks up new parameters once per message sent, and stops on the broadcast that carries
the stop flag; a final message tells the buffer this actor is done. :class:`Shipping` is its line to the
buffer, the same an inference worker ships its actors' records with.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from mpirl.comm.backoff import Backoff
from mpirl.comm.messages import EPISODE_SLOTS
from mpirl.comm.params import ParamFollower, param_channel
from mpirl.config import JobConfig
from mpirl.replay.ratio import InsertBudget
from mpirl.job.context import RoleContext
from mpirl.actor_learner.builder import ActorLearnerBuilder, Deciding, Games
from mpirl.actor_learner.experience import ExperienceSender
from mpirl.envs.outcomes import Outcome


class Acting:
    """One actor's games and its decisions in one process (the decisions' actor 0); no MPI.

    ``step()`` decides the next actions of every game, plays them and records what they led to; the
    transitions or episodes that became complete wait in the staging: ``take(n)`` hands out the first n
    with their initial priorities and ``drop(n)`` forgets them. Finished episodes wait in ``episodes``."""

    def __init__(self, games: Games, deciding: Deciding):
        self.games, self.deciding = games, deciding
        self.policy, self.staging, self.episodes = deciding.policy, deciding.staging, deciding.episodes
        self.frames, self.framed = deciding.frames, deciding.framed
        self.outcome: Outcome | None = None  # the games' last (none before start)

    @property
    def env_steps(self) -> int:
        return int(self.deciding.env_steps[0])

    @env_steps.setter
    def env_steps(self, value: int) -> None:
        self.deciding.env_steps[0] = value

    @property
    def env_errors(self) -> int:
        return self.games.env_errors

    @property
    def staged(self) -> int:
        return self.staging.count

    def epsilon(self) -> float:
        return self.deciding.epsilon(0)

    def start(self) -> None:
        """Build and reset the games (after the first parameters arrived)."""
        self.outcome = self.games.start()
        self.deciding.observe(0, self.outcome)

    def step(self) -> None:
        assert self.outcome is not None, "start() first"
        self.outcome = self.games.step(self.deciding.decide([0], [self.outcome]))
        self.deciding.observe(0, self.outcome)

    def take(self, rows: int) -> tuple[dict, np.ndarray]:
        """The first ``rows`` staged records (views, valid until ``drop``) and their initial priorities."""
        return self.deciding.take(rows)

    def oldest_frame(self, rows: int) -> int:
        """With frames once: the oldest frame a later message may refer to, once ``rows`` staged rows are sent."""
        return self.deciding.oldest_frame(rows)

    def drop(self, rows: int) -> None:
        self.deciding.drop(rows)

    def close(self) -> None:
        self.games.close()


def insert_budget(cfg: JobConfig, topo, staging) -> InsertBudget:
    """The share of ``replay.samples_per_insert``'s budget of one sender (an actor, or a worker for its actors).

    The sender counts what it has made: the records it sent and those in its ``staging``. Staged records
    are inserted once a batch is full, so counting them keeps what the buffers hold within the budget
    (up to one step's records); the slack, the staging's rows, lets every buffer still reach
    ``learning_starts`` while a sender holds back a part batch."""
    rp = cfg.replay
    rows = len(next(iter(staging.fields.values())))
    return InsertBudget(rp.samples_per_insert, rp.batch_size, cfg.comm.n_update, topo.n_actors,
                        rp.learning_starts, len(topo.buffers), topo.group.size - 1, slack=rows)


class Shipping:
    """A sender's line to its buffer (an actor's, or an inference worker's for the actors it serves): what the
    decisions staged, in messages of ``deciding.send_batch`` records with the sender's counters, within the
    decisions' budget (``deciding.budget(topo)``: the replay algorithms' :func:`insert_budget`, a trajectory
    queue's depth), and the goodbye. ``version``: the parameters the decisions hold; ``env_errors``: the games' failures."""

    def __init__(self, ctx: RoleContext, deciding: Deciding):
        cfg, topo = ctx.cfg, ctx.topo
        self.deciding, self.batch = deciding, deciding.send_batch
        self.sender = ExperienceSender(topo.group, ctx.spec, self.batch, cfg.comm.send_ring, topo.rank,
                                       deciding.frames, deciding.framed)
        # The algorithm's flow control (``over(sent, version)``, ``close()`` after the goodbye): a replay ratio, or
        # a window its queue grants.
        self.budget = deciding.budget(topo)
        self.steps_before = int(deciding.env_steps.sum())  # resumed: the steps before the checkpoint
        self.started = time.perf_counter()  # the clock of the steps/s reported
        self.started_at = math.nan  # the job clock's seconds when the sender's games began (set by its loop)
        self.throttled = 0.0  # seconds held back by the insert budget

    def over(self, version: int, first: int) -> bool:
        """Ahead of the learner, holding ``version`` (``first``: the first parameters received)?"""
        return self.budget.over(self.sender.sent + self.deciding.staging.count, version - first + 1)

    def send(self, rows: int, version: int, env_errors: int, final: bool = False) -> None:
        d = self.deciding
        records, priorities = d.take(rows)
        steps = int(d.env_steps.sum())
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        self.sender.send(records, priorities, d.episodes, final=final, oldest=d.oldest_frame(rows), env_steps=steps,
                         param_version=version, epsilon=float(np.mean([d.epsilon(a) for a in range(d.actors)])),
                         steps_per_s=(steps - self.steps_before) / elapsed, throttled_s=self.throttled,
                         env_errors=env_errors, started=self.started_at, torch_imported=float("torch" in sys.modules))
        d.drop(rows)

    def ship(self, version: int, env_errors: int) -> bool:
        """Send every full batch staged, a part one when the frames waiting might not fit the next message (frames
        once: games that have not made transitions yet, e.g. short episodes), and messages of no records while more
        episodes have finished than one message reports, so none waits here; True if anything went."""
        staging, sent = self.deciding.staging, False
        while staging.count >= self.batch:
            self.send(self.batch, version, env_errors)
            sent = True
        if self.sender.frames_due:
            self.send(min(staging.count, self.batch), version, env_errors)
            sent = True
        while len(self.deciding.episodes) > EPISODE_SLOTS:  # short episodes: more finished than a message tells
            self.send(0, version, env_errors)
            sent = True
        return sent

    def goodbye(self, version: int, env_errors: int) -> None:
        """The stop: unsent records are dropped (the learner has stopped), finished episodes reported, and the
        final message tells the buffer this sender is done."""
        d = self.deciding
        d.drop(d.staging.count)
        while len(d.episodes) > EPISODE_SLOTS:
            self.send(0, version, env_errors)
        self.send(0, version, env_errors, final=True)
        self.sender.close()
        self.budget.close()


def run_actor(ctx: RoleContext, builder: ActorLearnerBuilder) -> None:
    """An actor rank without an inference worker: its games and decisions from the algorithm's builder."""
    topo = ctx.topo
    acting = Acting(builder.make_games(ctx, f"actor rank {topo.rank}"), builder.make_deciding(ctx, [topo.rank]))
    if ctx.resume:  # count on from this actor's last recorded steps before the checkpoint
        acting.env_steps = ctx.resume.actor_steps.get(topo.rank, 0)
    shipping = Shipping(ctx, acting.deciding)
    params = ParamFollower(param_channel(topo.group_params, ctx.n_params, topo.group_params_each),
                           acting.policy.load_flat)
    params.start()  # the first parameters (or the stop): the insert budget counts from params.first
    acting.start()
    shipping.started, shipping.started_at = time.perf_counter(), ctx.now()
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
        if shipping.over(params.version, params.first):  # ahead of the learner: sleep until it publishes again
            t0 = time.perf_counter()
            waiting.sleep()
            shipping.throttled += time.perf_counter() - t0
            look = True
            continue
        acting.step()
        look = shipping.ship(params.version, acting.env_errors)
    shipping.goodbye(params.version, acting.env_errors)
    acting.close()
