"""The learner loop, one for every algorithm: a batch from a source, a train step, the values back, parameters out.

    batch = source.next_batch() -> values = algo.train(batch) -> source.give_back(batch, values)
    -> publish / checkpoint when due -> a metrics row

The algorithm (:class:`~mpirl.actor_learner.learner_algorithm.LearnerAlgorithm`) owns its networks, optimizer and metric
columns; the loop owns its counters (versions, episodes, returns, env steps, skipped batches, clocks, bytes) and
saves them in the checkpoint next to the algorithm's state. The sources (remote shards, a local memory) are in
:mod:`mpirl.actor_learner.batch_sources`.

Every ``n_update`` batches the parameters go out in a versioned broadcast; the last broadcast carries the stop flag.
With the inference worker on the learner's rank (``topology.workers = "learner"``, DMCAF's AW) the learner holds a
:class:`~mpirl.actor_learner.worker.Worker` and interleaves: it answers its actors' requests before each train step and
while it waits for replies or dumps, loads each version it publishes, and tells the actors to stop at the end.
K data-parallel learners (``topology.learners``) run this same loop; at fixed points of each turn it asks its
:class:`~mpirl.actor_learner.data_parallel.PeerAgreement` (:func:`learner_loop` picks: alone, or the learners'
agreement each step), so every learner stops, checkpoints and trains on the same turn.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from mpirl.comm.link import shaper_for
from mpirl.comm.params import param_channel
from mpirl.metrics.writer import MetricsFile
from mpirl.job import checkpoint
from mpirl.job.context import Interval, RoleContext
from mpirl.job.run_control import RunControl
from mpirl.actor_learner.builder import ActorLearnerBuilder
from mpirl.actor_learner.batch_sources import Batch, BatchSource, LocalMemory, RemoteShards, SourceInputs
from mpirl.actor_learner.counters import Clock, Counters
from mpirl.actor_learner.data_parallel import Alone, DataParallel, PeerAgreement
from mpirl.actor_learner.learner_peers import LearnerPeers
from mpirl.actor_learner.replay_buffer import Buffer
from mpirl.actor_learner.worker import Worker

F8, I8 = np.float64, np.int64
MAX_SKIPPED_IN_A_ROW = 100  # non-finite batches in a row that end the job as diverged


class Learner:
    """The loop: see the module's docstring, over the algorithm's ``builder`` (its training, and with the worker
    on this rank its decisions); ``agreement``: the learners it trains with (none: alone)."""

    def __init__(self, ctx: RoleContext, builder: ActorLearnerBuilder, agreement: PeerAgreement | None = None):
        cfg, topo = ctx.cfg, ctx.topo
        self.ctx, self.cfg = ctx, cfg
        self.agreement: PeerAgreement = agreement if agreement is not None else Alone()
        self.lead = self.agreement.lead  # this learner publishes, decides the stop, writes learner.h5 and checkpoints
        # More compute threads than cores the rank may run on only makes them wait for each other.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.threads = min(cfg.agent.torch_threads, cores)
        torch.set_num_threads(self.threads)
        self.rng = np.random.default_rng(ctx.seed())
        self.counters = Counters(len(topo.buffers), cfg.run.return_window)
        self.builder = builder
        self.algo = builder.training()(ctx, self.rng, self.counters, self.agreement.peers)
        self.params = (param_channel(topo.learner_params, self.algo.n_params, topo.learner_params_each,
                                     shaper=shaper_for(cfg.comm.link)) if self.lead else None)
        self.server = Worker(ctx, builder) if cfg.topology.on_learner else None  # the worker on this rank (AW)
        if self.server is not None:
            torch.set_num_threads(self.threads)  # the worker's decisions set one thread, as for a worker rank
        self.clock = Clock()
        self.source = self.make_source()
        # run.return_from = "least_exploring": only that actor's episodes count (buffers send NaN for the rest).
        counted = topo.least_exploring_actor if cfg.run.return_from == "least_exploring" else None
        self.control = RunControl(ctx, whose="" if counted is None else f" of actor {counted}")
        self.stop_reason = ""
        self.bytes_base = dict.fromkeys(("bytes_in", "bytes_in_raw", "bytes_out", "bytes_out_raw"), 0)
        if ctx.resume:
            self.restore(checkpoint.load(Path(ctx.resume.checkpoint), map_location=self.algo.device))
            self.source.links.resumed(ctx.resume.actor_steps)
        self.control.saved(self.algo.steps)  # the next checkpoint is a cadence after the start (or the resume)
        self.published_at = self.algo.steps
        self.open_metrics()

    def make_source(self) -> BatchSource:
        """The algorithm's own source, else batches sampled by the buffers (proposed) or a local replay they dump to
        (baseline); each made from what this loop hands it."""
        algo = self.algo
        given = SourceInputs(self.ctx, self.counters, self.clock, self.rng, algo.device, lambda: algo.steps,
                             algo.transferred, self.pump_params, self.serve if self.server is not None else None,
                             self.intake if self.ctx.topo.learner is None else None)
        if (own := algo.batch_source(given)) is not None:
            return own
        if self.cfg.replay.architecture == "proposed":
            return RemoteShards(given)
        return LocalMemory(given, algo.local_memory)

    def intake(self) -> Buffer:
        """With no buffer ranks: the buffer loop in this process, over the algorithm's server."""
        return Buffer(self.ctx, self.builder)

    # -- checkpoints ---------------------------------------------------------------
    def state(self) -> dict:
        """The loop's counters and the algorithm's state, one flat dict."""
        return {"identity": checkpoint.identity(self.cfg, self.ctx.topo.world.size),
                "train_steps": self.algo.steps, "job_time": self.ctx.now(),
                "learner_seconds": self.control.elapsed(),
                "torch_rng": torch.get_rng_state(), "numpy_rng": self.rng.bit_generator.state,
                **self.counters.state(), "clock": [self.clock.compute, self.clock.comm],
                "link_bytes": self.link_bytes(), **self.algo.state()}

    def restore(self, st: dict) -> None:
        """The algorithm's state and the loop's counters, clocks and generators from the checkpoint ``st``."""
        self.algo.restore(st)
        torch.set_rng_state(st["torch_rng"].cpu())
        self.rng.bit_generator.state = st["numpy_rng"]
        self.counters.restore(st)
        self.clock.compute, self.clock.comm = st["clock"]
        self.bytes_base = dict(st["link_bytes"])
        self.control.resumed(float(st["learner_seconds"]))  # run.wall_seconds counts on
        self.agreement.restored(st, self.counters)

    def checkpoint(self) -> None:
        """Metrics up to now on disk first: a run resumed from here drops only rows after it."""
        self.source.settle()  # the counts saved (and sent with the goodbye) include every batch
        self.log(force=True)
        self.file.flush()
        self.save()
        self.control.saved(self.algo.steps)

    def save(self) -> None:
        """The checkpoint file (several learners: the first's, with every learner's counts)."""
        extra = self.agreement.checkpoint_extra(self.counters)  # (K learners: collective)
        if self.lead:
            checkpoint.save(self.ctx.run_dir, {**self.state(), **extra}, self.cfg.checkpoint.keep)

    def due_for_checkpoint(self) -> bool:
        """The cadence of ``[checkpoint]`` (:class:`~mpirl.job.run_control.RunControl`) says one is due now."""
        return self.control.checkpoint_due(self.algo.steps)

    def checkpoint_timed(self) -> None:
        """A checkpoint in the loop, its time counted as compute."""
        with self.clock.computing():
            self.checkpoint()

    # -- metrics ---------------------------------------------------------------------
    def open_metrics(self) -> None:
        ctx, algo = self.ctx, self.algo
        name = "learner.h5" if self.lead else f"learner_{ctx.topo.rank}.h5"  # the first learner's: the shared one
        attrs = {**algo.file_attrs(self.threads), "rank": ctx.topo.rank, **self.agreement.file_attrs()}
        self.file = MetricsFile(ctx.run_dir / name, flush_seconds=self.cfg.log.flush_seconds,
                                attrs=attrs, resume=bool(ctx.resume))
        stats, timers = algo.columns()
        self.table = self.file.table("train", {
            "time": F8, "train_steps": I8, "env_steps": I8, **stats,
            "train_steps_per_s": F8, "compute_s": F8, "comm_s": F8, **timers,
            "bytes_in": I8, "bytes_in_raw": I8, "bytes_out": I8, "bytes_out_raw": I8, "samples_trained": I8,
            "return_mean20": F8, "episodes": I8, "param_version": I8, "skipped_batches": I8})
        self.source.links.open_tables(self.file)
        algo.open_tables(self.file)
        if ctx.resume:  # rows after the checkpoint describe work the resumed run does again
            self.table.truncate(self.table.rows_until("time", ctx.resume.job_time))
        self.tick = Interval(self.cfg.log.interval)
        # The last row's train steps and skipped batches (a resumed run's: its checkpoint's) and its time: a row's
        # rate spans the time since the row before, or since here for the first.
        self.last_row, self.last_t = (algo.steps, self.counters.skipped), self.ctx.now()

    def link_bytes(self) -> dict:
        """Bytes over the buffer <-> learner link so far: on the wire and before compression.

        In: batches and dumps from the buffers. Out: requests with priorities, and the
        parameter broadcasts (never compressed).
        """
        params = self.params.bytes_sent if self.params is not None else 0
        now = self.source.links.link_bytes()
        now["bytes_out"] += params
        now["bytes_out_raw"] += params
        return {k: v + self.bytes_base[k] for k, v in now.items()}  # a resumed run counts on

    def log(self, force: bool = False) -> None:
        if not (self.tick.due() or force):
            self.file.flush_if_due()
            return
        c, steps = self.counters, self.algo.steps
        if (steps, c.skipped) == self.last_row:
            # No batch since the last row, trained or skipped (warm-up, a refill after a resume, a checkpoint or the
            # stop right after a row): no row, so no train step appears twice; the next row's rate spans the time
            # since the last row, as its counters' growth does. A forced row (a checkpoint, the stop) still writes
            # the shards' rows: the baseline's counts per shard are settled only now.
            if force:
                self.source.links.write_rows()
            self.file.flush_if_due()
            return
        t = self.ctx.now()  # the row's time; its rate is over the time since the row before, on the same clock
        values = self.algo.row()  # may write the algorithm's own tables first
        self.table.append(
            time=t, train_steps=steps, env_steps=sum(c.env_steps),
            train_steps_per_s=(steps - self.last_row[0]) / max(t - self.last_t, 1e-9),
            compute_s=self.clock.compute, comm_s=self.clock.comm, **self.link_bytes(),
            samples_trained=steps * self.cfg.replay.batch_size,
            return_mean20=float(np.mean(c.returns)) if c.returns else math.nan,
            episodes=c.episodes, param_version=c.version, skipped_batches=c.skipped, **values)
        self.last_row, self.last_t = (steps, c.skipped), t
        self.source.links.write_rows()
        self.file.flush_if_due()

    # -- parameters, the worker on this rank, stopping --------------------------------
    def publish(self, stop: bool = False) -> None:
        with self.clock.communicating():
            self.counters.version += 1
            if self.params is None:  # another learner: the first publishes the parameters they share
                return
            flat = self.algo.flat_params()
            self.params.publish(self.counters.version, flat, stop=stop)
        if self.server and not stop:
            self.server.load(flat, self.counters.version)

    def pump_params(self) -> None:
        """Release held parameter sends (the emulated link); another learner than the first publishes none."""
        if self.params is not None:
            self.params.pump()

    def publish_due(self) -> None:
        steps = self.algo.steps
        if steps % self.cfg.comm.n_update == 0 and steps != self.published_at:  # a skipped batch is no step
            self.published_at = steps
            self.publish()

    def serve(self) -> bool:
        """With the worker on this rank: a turn of it; True when it answered a pass."""
        return self.server is not None and self.server.turn() == 0

    def should_stop(self) -> bool:
        """The stop rule of ``[run]`` (:class:`~mpirl.job.run_control.RunControl`); its reason in :attr:`stop_reason`."""
        c = self.counters
        self.stop_reason = self.control.stop_reason(train_steps=self.algo.steps, env_steps=sum(c.env_steps),
                                                    returns=c.returns)
        return bool(self.stop_reason)

    # -- the loop ----------------------------------------------------------------------
    def train(self, batch: Batch, peer_stats: np.ndarray | None) -> np.ndarray:
        """The algorithm's step on ``batch``; a skipped step is counted and the batch keeps its values."""
        c = self.counters
        values = self.algo.train(batch, peer_stats)
        if values is None:  # non-finite loss or gradient
            c.skipped += 1
            c.skipped_in_a_row += 1
            if c.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
                raise FloatingPointError(self.algo.divergence(c.skipped_in_a_row))
            return np.array(batch.values, dtype=np.float32)
        c.skipped_in_a_row = 0
        return values

    def run(self) -> str:
        """Train until the stop; the stop reason."""
        agreement = self.agreement
        self.publish()  # version 1: every actor starts from the learner's initial weights
        self.source.start()
        while True:
            batch = self.next_batch()
            turn = agreement.before_step(batch, self.algo, self.due_for_checkpoint, self.poll_peers)
            if turn.stop:
                self.stop_reason = turn.reason or self.stop_reason
                break
            if turn.checkpoint:
                self.checkpoint_timed()
            assert batch is not None  # only the learner that decides comes without one, and then to stop
            with self.clock.computing():
                values = self.train(batch, turn.stats)
            self.source.give_back(batch, values)
            self.publish_due()
            if agreement.checkpoint_after_step(self.due_for_checkpoint):
                self.checkpoint_timed()
            self.log()
        self.shutdown()
        return self.stop_reason

    def next_batch(self) -> Batch | None:
        """This learner's next batch (K learners: its part), waiting for it; None when the learner that decides
        the stop (alone, or the first) is to stop."""
        while not self.stopping():
            batch = self.source.next_batch()
            if batch is not None:
                return batch
            self.log()
            self.source.wait()
        return None

    def stopping(self) -> bool:
        """The stop rule, on the learner that decides; another learner tells it of a signal here."""
        if self.lead:
            return self.should_stop()
        self.forward_signal()
        return False

    def forward_signal(self) -> None:
        """A signal on this rank: tell the first learner (which stops the job)."""
        if self.ctx.preempt is not None:
            self.ctx.preempt.requested()

    def poll_peers(self) -> None:
        """While waiting for the other learners: the emulated link's held sends, a signal forwarded."""
        self.pump_params()
        self.source.links.pump()
        if not self.lead:
            self.forward_signal()

    def shutdown(self) -> None:
        """The algorithm's last words, a checkpoint, the last broadcast with the stop flag, goodbye to the buffers,
        drain every reply.

        The checkpoint's row is the last learner/train row: nothing trains after it. What crosses after it
        (the stop broadcast, the replies in flight at the stop) is in the file's totals, the root attributes
        ``bytes_in``, ``bytes_in_raw``, ``bytes_out`` and ``bytes_out_raw``.
        """
        self.algo.finish()
        self.checkpoint()
        self.publish(stop=True)
        if self.server:  # the actors learn the stop in their next answer; the worker's goodbye to the buffer
            self.server.finish()
        self.source.links.close(self.algo.steps)
        if self.params is not None:
            self.params.close()
        self.file.set_attrs(stop_reason=self.stop_reason, train_steps=self.algo.steps, **self.link_bytes(),
                            **self.agreement.final_attrs(self.algo.flat_params))
        self.file.close()


def learner_loop(ctx: RoleContext, builder: ActorLearnerBuilder) -> Learner:
    """The loop for this rank: one learner's, or with ``topology.learners = K > 1`` this one of the data-parallel
    learners (their agreement built here, collectively, before the algorithm); with ``topology.workers =
    "learner"`` it serves the actors too."""
    comm = ctx.topo.comm("gradients")
    agreement = None if comm is None else DataParallel(LearnerPeers(comm, ctx.cfg.replay.batch_size))
    return Learner(ctx, builder, agreement)


def run_learner(ctx: RoleContext, builder: ActorLearnerBuilder) -> str:
    """A learner rank: the loop over the algorithm's training; returns why it stopped."""
    return learner_loop(ctx, builder).run()
