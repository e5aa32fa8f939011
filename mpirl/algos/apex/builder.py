"""Ape-X as the actor → buffer → learner family sees it: vector games, ε-greedy decisions with n-step windows
(:mod:`mpirl.algos.apex.serving`), a prioritized shard of n-step transitions on each buffer, the dueling double DQN
learner (:mod:`mpirl.algos.apex.learner`). Each part is imported where a rank makes it (torch only where a
network is)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpirl.actor_learner.buffer_servers import Buffer, Server, placement_server
from mpirl.actor_learner.builder import Deciding, VectorGamesBuilder
from mpirl.config import JobConfig
from mpirl.job.context import RoleContext

if TYPE_CHECKING:
    from mpirl.actor_learner.learner_algorithm import AlgorithmFactory


class ApexBuilder(VectorGamesBuilder):
    def make_deciding(self, ctx: RoleContext, actors: list[int]) -> Deciding:
        """Each actor with its own rank's seed and its Ape-X ε by its index among all the job's actors."""
        from mpirl.algos.apex.serving import ApexDeciding  # torch only for a convolutional network
        everyone = sorted(ctx.topo.worker_of or ctx.topo.buffer_of)  # the actors (without workers: the senders)
        return ApexDeciding(ctx.cfg, ctx.spaces, ctx.spec, [ctx.seed_of(a) for a in actors],
                            [everyone.index(a) for a in actors], len(everyone))

    def make_server(self, buffer: Buffer, share: int) -> Server:
        """The placement's server over a prioritized shard of n-step transitions."""
        from mpirl.replay.shard import PrioritizedShard
        rp = buffer.cfg.replay

        def shard() -> Any:
            return PrioritizedShard(buffer.spec, rp.capacity, rp.alpha, rp.priority_eps,
                                    dedup_frames=rp.dedup_frames, stream_frames=buffer.stream_frames)
        return placement_server(buffer, share, shard)

    def sender_lag(self, cfg: JobConfig) -> int:
        return cfg.apex.n_step  # a transition leaves its window n steps after its first frame

    def training(self) -> AlgorithmFactory:
        from mpirl.algos.apex.learner import ApexTraining
        return ApexTraining
