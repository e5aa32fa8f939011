"""The QMIX buffer: the shared buffer loop over episodes.

Receiving actors' messages, serving the learner's requests (applying the weights a request carries
before sampling), relaying parameters and writing the group's metrics are the same as Ape-X's
(:mod:`mpirl.actor_learner.replay_buffer`); what differs is the memory: an episode shard with a uniform or an
AccMER sampler (:class:`~mpirl.replay.episode_shard.EpisodeShard`). The baseline placement relays
whole episodes as Ape-X's relays transitions.
"""

from __future__ import annotations

from mpirl.replay.episode_shard import EpisodeShard
from mpirl.replay.quotas import max_quota
from mpirl.job.context import RoleContext
from mpirl.actor_learner.replay_buffer import Buffer


class EpisodeBuffer(Buffer):
    def make_shard(self):
        rp = self.cfg.replay
        share = max_quota(rp.batch_size, len(self.ctx.topo.buffers), "even")
        q = self.cfg.qmix
        return EpisodeShard(self.spec, rp.capacity, q.sampler, share, q.accmer_alpha, q.accmer_discount)


def run_buffer(ctx: RoleContext) -> None:
    EpisodeBuffer(ctx).run()
