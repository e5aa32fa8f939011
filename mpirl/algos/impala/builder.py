"""IMPALA as the actor → buffer → learner family sees it: vector games, decisions that sample from the actor's copy
of the policy and record trajectories (:mod:`mpirl.algos.impala.serving`), a trajectory queue on each buffer
(:mod:`mpirl.algos.impala.queue_server`), the V-trace learner (:mod:`mpirl.algos.impala.learner`). Each part is
imported where a rank makes it (torch only where a network is)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpirl.actor_learner.buffer_servers import Buffer, Server
from mpirl.actor_learner.builder import Deciding, VectorGamesBuilder
from mpirl.config import JobConfig
from mpirl.job.context import RoleContext

if TYPE_CHECKING:
    from mpirl.actor_learner.learner_algorithm import AlgorithmFactory


class ImpalaBuilder(VectorGamesBuilder):
    def make_deciding(self, ctx: RoleContext, actors: list[int]) -> Deciding:
        """Each actor with its own rank's seed and its delay (``impala.actor_delay_us``, by its index among all
        the job's actors)."""
        from mpirl.algos.impala.serving import ImpalaDeciding  # torch only for a convolutional or recurrent network
        everyone = sorted(ctx.topo.worker_of or ctx.topo.buffer_of)  # the actors (without workers: the senders)
        delays = ctx.cfg.impala.actor_delay_us
        delays = [delays[0] if len(delays) == 1 else delays[everyone.index(a)] for a in actors]
        return ImpalaDeciding(ctx.cfg, ctx.spaces, ctx.spec, [ctx.seed_of(a) for a in actors], delays)

    def make_server(self, buffer: Buffer, share: int) -> Server:
        """A trajectory queue, whatever the placement: each trajectory is trained on once (or replayed)."""
        from mpirl.algos.impala.queue_server import QueueServer
        return QueueServer(buffer, share)

    def message_rows(self, cfg: JobConfig, games: int) -> int:
        return games  # one trajectory per game a sender steps, all finished together

    def training(self) -> AlgorithmFactory:
        from mpirl.algos.impala.learner import ImpalaTraining
        return ImpalaTraining
