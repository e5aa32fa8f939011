"""The Ape-X buffer: the shared buffer loop (:mod:`mpirl.actor_learner.replay_buffer`) over a prioritized shard of
n-step transitions (what its shard server serves from; a relay's memory is the loop's own)."""

from __future__ import annotations

from mpirl.replay.shard import PrioritizedShard
from mpirl.job.context import RoleContext
from mpirl.actor_learner.replay_buffer import Buffer


class PrioritizedBuffer(Buffer):
    def sender_lag(self) -> int:
        return self.cfg.apex.n_step

    def make_shard(self):
        rp = self.cfg.replay
        return PrioritizedShard(self.spec, rp.capacity, rp.alpha, rp.priority_eps, dedup_frames=rp.dedup_frames,
                                stream_frames=self.stream_frames)


def run_buffer(ctx: RoleContext) -> None:
    PrioritizedBuffer(ctx).run()
