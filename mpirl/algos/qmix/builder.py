"""QMIX and MAC-PO as the actor → buffer → learner family sees them: a team's games and the agent network's
decisions, recording whole episodes (:mod:`mpirl.algos.qmix.playing`), an episode shard with a uniform or an
AccMER sampler on each buffer, the mixing learner (:mod:`mpirl.algos.qmix.learner`). Each part is imported where a
rank makes it (torch only where a network is)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mpirl.actor_learner.buffer_servers import Buffer, Server, placement_server
from mpirl.actor_learner.builder import ActorLearnerBuilder, Deciding, Games
from mpirl.job.context import RoleContext

if TYPE_CHECKING:
    from mpirl.actor_learner.learner_algorithm import AlgorithmFactory


class QmixBuilder(ActorLearnerBuilder):
    def step_spec(self, spaces: Any) -> dict:
        from mpirl.algos.qmix.playing import step_spec
        return step_spec(spaces)

    def action_field(self, spaces: Any) -> tuple[tuple[int, ...], np.dtype]:
        return (spaces.n_agents,), np.dtype(np.int64)  # one action per agent of the team

    def make_games(self, ctx: RoleContext, label: str) -> Games:
        from mpirl.algos.qmix.playing import Games as TeamGames
        return TeamGames(ctx.cfg, ctx.spaces, ctx.seed(), label)

    def make_deciding(self, ctx: RoleContext, actors: list[int]) -> Deciding:
        """Each actor exploring from its own rank's seed."""
        from mpirl.algos.qmix.playing import Deciding as TeamDeciding  # the agent network in numpy: no torch
        return TeamDeciding(ctx.cfg, ctx.spaces, ctx.spec, [ctx.seed_of(a) for a in actors])

    def make_server(self, buffer: Buffer, share: int) -> Server:
        """The placement's server over an episode shard (its sampler: ``qmix.sampler``)."""
        from mpirl.replay.episode_shard import EpisodeShard
        from mpirl.replay.quotas import max_quota
        rp, q = buffer.cfg.replay, buffer.cfg.qmix

        def shard() -> Any:
            part = max_quota(rp.batch_size, len(buffer.ctx.topo.buffers), "even")
            return EpisodeShard(buffer.spec, rp.capacity, q.sampler, part, q.accmer_alpha, q.accmer_discount)
        return placement_server(buffer, share, shard)

    def training(self) -> AlgorithmFactory:
        from mpirl.algos.qmix.learner import QmixTraining
        return QmixTraining
