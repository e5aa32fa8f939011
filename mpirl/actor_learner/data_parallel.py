"""The learner loop of K data-parallel learners (``topology.learners``; Gorila's several learners), over the one
learner loop (:mod:`mpirl.actor_learner.learner`) and the agreement of :mod:`mpirl.actor_learner.learner_peers`.

Each turn: this learner's part of the next batch, the control gather (the first learner's stop and checkpoint, the
parts' statistics, a parameter CRC now and then), the train step whose gradients are summed over the learners, the
part's values back to where it came from; the first learner publishes every ``comm.n_update`` steps. The first
learner writes ``learner.h5`` and the checkpoints (with every learner's per-shard sample counts); learner k writes
``learner_<rank>.h5`` and restores its own counts on ``--resume``.
"""

from __future__ import annotations

import math

from mpirl.job import checkpoint
from mpirl.actor_learner.batch_sources import Batch
from mpirl.actor_learner.learner import Learner
from mpirl.actor_learner.learner_peers import CHECK_EVERY, LearnerPeers
from mpirl.actor_learner.shard_links import ShardLinks


class DataParallelLearner(Learner):
    peers: LearnerPeers

    def __init__(self, ctx, algorithm):
        self.peers = LearnerPeers(ctx.topo.comm("gradients"), ctx.cfg.replay.batch_size)
        self.lead = self.peers.lead
        super().__init__(ctx, algorithm)

    def restore(self, st: dict) -> None:
        super().restore(st)
        self.counters.consumed = list(st["learners_consumed"][self.peers.index])  # its own samples per shard
        if not self.lead:  # episodes and returns are the first learner's
            self.counters.episodes = 0
            self.counters.returns.clear()

    def save(self) -> None:
        """Every learner's samples per shard, kept by the first with the state they share."""
        consumed = self.peers.gather_counts(self.counters.consumed)
        if self.lead:
            checkpoint.save(self.ctx.run_dir, {**self.state(), "learners_consumed": consumed},
                            self.cfg.checkpoint.keep)

    def final_attrs(self) -> dict:
        return {"params_crc32": int(self.peers.crc(self.algo.flat_params()))}

    def run(self) -> str:
        source, peers = self.source, self.peers
        self.publish()
        source.start()
        while True:
            stop = self.lead and self.should_stop()
            batch = None if stop else self.next_part()
            if batch is None:
                stop = True  # (the first learner only: a stop condition came while it waited)
            steps = self.algo.steps
            ctl = peers.control(stop, self.lead and not stop and self.due_for_checkpoint(),
                                self.algo.shared_stat(batch) if batch is not None else math.inf,
                                self.algo.flat_params() if steps % CHECK_EVERY == 0 else None, steps, poll=self.poll)
            if ctl.stop:
                break
            if ctl.checkpoint:
                with self.clock.computing():
                    self.checkpoint()
            assert batch is not None  # only the first learner comes without one, and then to stop
            self.algo.peer_stats = ctl.stats
            with self.clock.computing():
                values = self.train(batch)
            source.give_back(batch, values)
            self.publish_due()
            self.log()
        if not self.lead:
            self.stop_reason = "the first learner stopped the job"
        self.shutdown()
        return self.stop_reason

    def next_part(self) -> Batch | None:
        """This learner's part of the next batch, waiting for it; None when the first learner is to stop."""
        source = self.source
        while True:
            batch = source.next_batch()
            if batch is not None:
                return batch
            self.log()
            source.wait()
            if self.lead:
                if self.should_stop():
                    return None
            elif self.ctx.preempt is not None:
                self.ctx.preempt.requested()  # a signal here: tell the first learner

    def poll(self) -> None:
        """While waiting for the other learners: the emulated link's held sends, a signal forwarded."""
        self.pump_params()
        if isinstance(self.source.links, ShardLinks):  # (several learners draw from the buffers: always)
            self.source.links.pump()
        if not self.lead and self.ctx.preempt is not None:
            self.ctx.preempt.requested()
