"""The buffer loop of the replay-based algorithms: receive experiences, serve the learner, relay parameters.

The loop never names an algorithm: what it serves the learner from comes from the algorithm's builder
(:meth:`~mpirl.actor_learner.builder.ActorLearnerBuilder.make_server`). For the replay algorithms that is the
placement's server (:mod:`mpirl.actor_learner.buffer_servers`) over their replay memory (Ape-X: a prioritized
shard of transitions; QMIX: an episode shard), a
:class:`~mpirl.actor_learner.buffer_servers.ShardServer` (the replay memory lives here; requests bring priorities
back and get sampled batches) or a :class:`~mpirl.actor_learner.buffer_servers.Relay` (the latest experiences
with their actors' priorities, shipped whole to the learner's own memory); IMPALA's is a trajectory queue.
Either way the loop relays
every parameter broadcast from the learner to the actors, and writes the group's metrics (buffer
counters, episodes, actor stats) to HDF5.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from mpirl.comm.backoff import Backoff
from mpirl.comm.messages import (BYE, DUMP, SAMPLE, TAG_EXPERIENCE, TAG_REPLY, TAG_REQUEST, experience_layout,
                                 request_layout)
from mpirl.actor_learner.episode_tally import EpisodeTally
from mpirl.comm.codec import codec_for
from mpirl.comm.link import shaper_for
from mpirl.comm.params import ParamBroadcast, param_channel
from mpirl.comm.pools import RecvPool, SendRing
from mpirl.metrics.writer import MetricsFile
from mpirl.replay.quotas import max_quota
from mpirl.replay.frame_stream import FrameWindows, window_frames
from mpirl.replay.frames import framed_fields
from mpirl.replay import snapshot
from mpirl.job.checkpoint import CKPT_DIR
from mpirl.job.context import Interval, RoleContext
from mpirl.actor_learner.builder import ActorLearnerBuilder
from mpirl.actor_learner.experience import store_experience

F8, I8 = np.float64, np.int64


class Buffer:
    """A buffer rank's loop (or, with ``topology.buffers = 0``, the learner's own intake, in its process)."""

    def __init__(self, ctx: RoleContext, builder: ActorLearnerBuilder):
        cfg, topo = ctx.cfg, ctx.topo
        self.ctx, self.cfg = ctx, cfg
        self.spec = spec = ctx.spec
        self.rng = np.random.default_rng(ctx.seed())
        share = max_quota(cfg.replay.batch_size, len(topo.buffers), cfg.replay.shares)
        self.min_fill = max(1, int(np.ceil(cfg.replay.learning_starts / len(topo.buffers))))

        dedup = cfg.replay.dedup_frames
        self.framed = framed = framed_fields(spec) if dedup else {}
        self.n_actors = topo.group.size - 1  # the ranks that send experiences here (actors, or their workers)
        # Frames once on the wire: each sender's frames arrive once and wait in its window (frame_stream).
        served = [len(topo.served_by(a)) for a in topo.actors_of(topo.rank)] if topo.worker_of else []
        games = cfg.env.envs_per_actor * max(served + [1])  # the most games one sender steps
        rows = builder.message_rows(cfg, games)
        self.exp = experience_layout(spec, rows, framed, games)
        lag = builder.sender_lag(cfg)
        self.stream_frames = self.n_actors * window_frames(rows, games, lag, framed) if framed else 0
        self.req = request_layout(share)
        # The placement: the replay memory here (served in batches), or relayed whole to the learner's; or a queue.
        self.server = builder.make_server(self, share)
        self.store, self.reply = self.server.memory, self.server.reply
        self.exp_pool = RecvPool(topo.group, list(range(1, self.n_actors + 1)), TAG_EXPERIENCE,
                                 self.exp.max_nbytes, cfg.comm.recv_depth)
        ring = self.server.ring
        pool = ring.pool if framed and ring is not None else None  # the frames' pool, with frames once
        self.windows = FrameWindows(pool) if framed and pool is not None else None
        # A layout without a learner link (the senders' experience straight into the learner): this buffer is
        # the learner's own intake, in its process; the learner takes from the memory and broadcasts itself.
        self.local = topo.learner is None
        self.params_out: ParamBroadcast | None = None
        # The learners (K data-parallel ones: ranks 0..K-1 of the learner communicator) each ask for their part.
        self.learners = topo.layout.count("learner")
        self.consumed_by = [0] * self.learners  # samples each learner trained on from here
        self.byes = [False] * self.learners
        if not self.local:  # a local buffer has no req_pool, replies or params_in
            codec = codec_for(cfg.comm.link)
            self.req_pool = RecvPool(topo.learner, list(range(self.learners)), TAG_REQUEST, self.req.max_nbytes, 1,
                                     codec=codec)
            self.replies = [SendRing(topo.learner, k, TAG_REPLY, self.reply.max_nbytes,
                                     self.server.depth, shaper=shaper_for(cfg.comm.link),
                                     codec=codec, chunk_bytes=int(cfg.comm.max_message_mb * 2**20))
                            for k in range(self.learners)]
            self.params_in = param_channel(topo.learner_params, ctx.n_params, topo.learner_params_each)
            # To its senders, where the layout declares that link (the learner's rank as the one worker keeps its
            # own).
            self.params_out = (param_channel(topo.group_params, ctx.n_params, topo.group_params_each)
                               if topo.group_params else None)

        self.waiting: deque = deque()  # SAMPLE requests waiting for the shard to fill: (learner, seq, want)
        # Finished episodes not yet told to the learner: all counted, the latest returns its window counts
        # (run.return_from = "least_exploring": that actor's alone), as many as a reply holds.
        self.to_learner = EpisodeTally(self.reply.slot_length("ep_return"))
        self.window_actor = topo.least_exploring_actor if cfg.run.return_from == "least_exploring" else None
        self.actor_steps: dict[int, int] = {}
        self.actor_logged: dict[int, float] = {}
        self.inserted = self.consumed = self.stale = self.updates = 0
        self.finals = 0
        self.stop_steps = 0  # the learner's train steps at the stop (its BYE): names the stop checkpoint
        self._open_metrics()
        if ctx.resume and cfg.checkpoint.replay:
            self._restore_replay(ctx.resume.train_steps)

    def _open_metrics(self) -> None:
        ctx = self.ctx
        self.file = MetricsFile(ctx.run_dir / f"buffer_{ctx.topo.rank}.h5", flush_seconds=ctx.cfg.log.flush_seconds,
                                attrs={"role": "buffer", "rank": ctx.topo.rank, "capacity": self.cfg.replay.capacity,
                                       "architecture": self.cfg.replay.architecture,
                                       "dedup_frames": bool(self.store.framed),
                                       "actors": ctx.topo.actors_of(ctx.topo.rank)}, resume=bool(ctx.resume))
        self.t_buffer = self.file.table("buffer", {
            "time": F8, "experiences_in": I8, "experiences_in_per_s": F8, "bytes_in": I8, "bytes_out": I8,
            "bytes_out_raw": I8,
            "fill": I8, "stale_updates": I8, "priority_updates": I8, "consumed": I8, "alpha": F8,
            "total_priority": F8, "bytes_held": I8, **self.server.columns()})
        self.t_episodes = self.file.table("episodes", {"time": F8, "actor": I8, "env_steps": I8,
                                                       "return": F8, "length": I8})
        self.t_actors = self.file.table("actors", {"time": F8, "actor": I8, "env_steps": I8,
                                                   "env_steps_per_s": F8, "epsilon": F8, "param_version": I8,
                                                   "throttled_s": F8, "env_errors": I8, "started_s": F8,
                                                   "torch_imported": np.bool_})
        # Cumulative columns continue from the last row at or before a resumed run's checkpoint.
        self.base = dict.fromkeys(("bytes_in", "bytes_out", "bytes_out_raw"), 0)
        if ctx.resume:
            t = ctx.resume.job_time
            for table in (self.t_buffer, self.t_episodes, self.t_actors):
                table.truncate(table.rows_until("time", t))
            if self.t_buffer.rows:
                last = {c: ds[self.t_buffer.rows - 1] for c, ds in self.file.columns("buffer").items()}
                self.base = {k: int(last[k]) for k in self.base}
                self.inserted, self.stale = int(last["experiences_in"]), int(last["stale_updates"])
                self.updates, self.consumed = int(last["priority_updates"]), int(last["consumed"])
            self.actor_steps = {a: s for a, s in ctx.resume.actor_steps.items() if a in ctx.topo.actors_of(ctx.topo.rank)}
        self.tick = Interval(self.cfg.log.interval)
        self.last_in, self.last_t = self.inserted, ctx.now()
        # Each actor's env steps and time at its last row: its rate spans the time since; its first row's, the time
        # since its games began (its ``started`` on the job clock), so the start-up before them is not counted.
        self.opened = self.last_t
        self.actor_last: dict[int, tuple[int, float | None]] = {a: (self.actor_steps.get(a, 0), None)
                                                               for a in ctx.topo.actors_of(ctx.topo.rank)}

    # -- experiences from actors -----------------------------------------------
    def on_experience(self, buf: np.ndarray, source: int) -> bool:
        """Store one message of sender ``source`` (its rank in the group); returns True if it was its last."""
        exp = self.exp
        rows = store_experience(self.store, exp, buf, self.server.prioritized, self.windows, self.framed)
        self.inserted += rows
        actor = int(exp.get(buf, "actor"))
        t = self.ctx.now()
        steps = self.actor_steps[actor] = int(exp.get(buf, "env_steps"))
        k = int(exp.get(buf, "episodes"))
        if k:
            rets = exp.get(buf, "ep_return")[:k].copy()
            self.t_episodes.extend(time=np.full(k, t), actor=np.full(k, actor), env_steps=np.full(k, steps),
                                   length=exp.get(buf, "ep_length")[:k].astype(I8), **{"return": rets})
            self.to_learner.add(rets.tolist(), counted=self.window_actor is None or actor == self.window_actor)
        final = bool(exp.get(buf, "final"))
        if final or self.actor_logged.get(actor, -np.inf) + self.cfg.log.interval <= t:
            self.actor_logged[actor] = t
            last_steps, last_t = self.actor_last.get(actor, (0, None))
            if last_t is None:
                started = float(exp.get(buf, "started"))
                last_t = started if np.isfinite(started) and started < t else self.opened  # (another node's clock)
            self.actor_last[actor] = steps, t
            rate = (steps - last_steps) / max(t - last_t, 1e-9)
            self.t_actors.append(time=t, actor=actor, env_steps=steps, env_steps_per_s=rate,
                                 epsilon=exp.get(buf, "epsilon"), param_version=int(exp.get(buf, "param_version")),
                                 throttled_s=exp.get(buf, "throttled_s"), env_errors=int(exp.get(buf, "env_errors")),
                                 started_s=exp.get(buf, "started"),
                                 torch_imported=bool(exp.get(buf, "torch_imported")))
        self.server.arrived(source, rows, final)
        return final

    # -- the learner's requests ------------------------------------------------
    def on_request(self, buf: np.ndarray, learner: int = 0) -> None:
        """A request of ``learner`` (its rank among the learners): the priorities it brings back, then a sample
        to serve when the shard can, a dump now, or its goodbye."""
        req, rows = self.req, self.req.rows(buf)
        kind = int(req.get(buf, "kind"))
        self.consumed_by[learner] = int(req.get(buf, "consumed"))
        self.consumed = sum(self.consumed_by)
        stale, applied = self.server.feedback(req, buf, rows)
        self.stale, self.updates = self.stale + stale, self.updates + applied
        if kind == SAMPLE:
            self.waiting.append((learner, req.get(buf, "seq"), int(req.get(buf, "want"))))
        elif kind == DUMP:
            self.serve(DUMP, float(req.get(buf, "seq")), learner=learner)
        elif kind == BYE:
            self.byes[learner] = True
            if learner == 0:
                self.stop_steps = int(req.get(buf, "train_steps"))

    def _send_reply(self, slot: int, buf: np.ndarray, kind: int, seq: float, rows: int, frames: int = 0,
                    learner: int = 0) -> None:
        # Finished episodes go to the first learner (the one that decides the stop and writes the returns).
        k, rets = self.to_learner.take() if learner == 0 else (0, [])
        self.reply.set(buf, rows=rows, kind=kind, seq=seq, shard_size=self.store.size,
                       shard_total=self.server.reply_total, env_steps=sum(self.actor_steps.values()),
                       inserted=self.inserted, episodes=k, returns=len(rets), ep_return=rets)
        counted = dict.fromkeys(self.reply.counted, frames)  # every counted field of a reply: one row per frame sent
        self.reply.set(buf, **{f"{name}_rows": n for name, n in counted.items()})
        self.replies[learner].send(slot, self.reply.nbytes(rows, **counted))

    def serve(self, kind: int, seq: float, want: int = 0, learner: int = 0) -> None:
        """One reply to ``learner``: a batch of ``want`` records (a shard server) or the whole memory (a relay)."""
        slot, buf = self.replies[learner].acquire()
        rows, frames = self.server.fill(buf, want, self.rng)
        self._send_reply(slot, buf, kind, seq, rows, frames, learner)

    # -- the loop ----------------------------------------------------------------
    def finished(self) -> bool:
        return (all(self.byes) and self.finals == self.n_actors and not self.waiting
                and (self.params_out is None or self.params_out.done()))

    def step(self) -> bool:
        """One pass over every source of work; True if anything happened."""
        if not self.local:  # (a local buffer's learner hears signals and pumps its own sends)
            self.ctx.preempt.requested()  # a signal here: tell the learner, which stops the job
            for ring in self.replies:
                ring.pump()
            if self.params_out is not None:  # sent to each sender on its own: the newest to those it is due
                self.params_out.pump()
        progress = self.take_experience()
        if not self.local:
            progress = self.serve_learner() or progress
        if self.tick.due():
            self.write_row()
        self.file.flush_if_due()
        return self.server.turn() or progress

    def take_experience(self) -> bool:
        """Store every sender's message that has arrived; True if any did."""
        progress = False
        for slot, source, buf, _ in self.exp_pool.poll():
            progress = True
            if self.on_experience(buf, source):
                self.finals += 1
            else:
                self.exp_pool.post(slot)
        return progress

    def serve_learner(self) -> bool:
        """The learner's requests, the replies waiting for the memory, and the parameters to relay."""
        progress = False
        for slot, learner, buf, _ in self.req_pool.poll():
            progress = True
            self.on_request(buf, learner)
            if not self.byes[learner]:
                self.req_pool.post(slot)
        while self.waiting and (self.server.ready(self.waiting[0][2]) or self.byes[self.waiting[0][0]]):
            learner, seq, want = self.waiting.popleft()
            self.serve(SAMPLE, seq, want, learner)
            progress = True
        if not self.params_in.closed and self.params_in.arrived():
            progress = True
            if self.params_out is not None:
                self.params_out.publish(self.params_in.version, self.params_in.params, stop=self.params_in.stop)
            if not self.params_in.stop:
                self.params_in.post()
        return progress

    def write_row(self) -> None:
        t = self.ctx.now()
        rate = (self.inserted - self.last_in) / max(t - self.last_t, 1e-9)
        self.last_in, self.last_t = self.inserted, t
        self.t_buffer.append(
            time=t, experiences_in=self.inserted, experiences_in_per_s=rate,
            bytes_in=self.base["bytes_in"] + self.exp_pool.bytes_received,
            bytes_out=self.base["bytes_out"] + (0 if self.local else sum(r.bytes_sent for r in self.replies)),
            bytes_out_raw=self.base["bytes_out_raw"] + (0 if self.local else
                                                        sum(r.raw_bytes_sent for r in self.replies)),
            fill=self.store.size,
            stale_updates=self.stale,
            priority_updates=self.updates, consumed=self.consumed,
            alpha=self.inserted / self.consumed if self.consumed else np.nan,
            total_priority=self.server.total, bytes_held=self.store.nbytes, **self.server.row())

    # -- checkpoint.replay ---------------------------------------------------------
    def _replay_file(self):
        return self.ctx.run_dir / CKPT_DIR / f"replay-{self.ctx.topo.rank}.npz"

    def _save_replay(self) -> None:
        """The memory as the job stops, beside the learner's stop checkpoint (same train steps)."""
        path = self._replay_file()
        path.parent.mkdir(exist_ok=True)
        snapshot.save(path, snapshot.snapshot(self.store), train_steps=self.stop_steps)

    def _restore_replay(self, steps: int) -> None:
        """The memory the job saved when it stopped at ``steps`` train steps (the checkpoint resumed from)."""
        path = self._replay_file()
        where = f"mpirl: buffer rank {self.ctx.topo.rank}"
        if not path.exists():
            print(f"{where}: no replay snapshot ({path.name}); the memory starts empty", flush=True)
            return
        arrays, meta = snapshot.load(path)
        if meta.get("train_steps") != steps:
            print(f"{where}: {path.name} is from train step {meta.get('train_steps')}, the checkpoint from "
                  f"{steps}; the memory starts empty", flush=True)
            return
        n = snapshot.restore(self.store, arrays)
        print(f"{where}: replay restored, {n} records from {path.name}", flush=True)

    def run(self) -> None:
        self.params_in.post()
        backoff = Backoff()
        while not self.finished():
            if self.step():
                backoff.reset()
            else:
                backoff.sleep()
        self.close()

    def close(self) -> None:
        """The server's last words (every sender has said goodbye), the last row, the replay snapshot when asked,
        and every request completed or cancelled."""
        self.server.close()
        self.write_row()
        if self.cfg.checkpoint.replay:
            self._save_replay()
        # Memory per slot as the run left it (frames stored once fill lazily, so not known at start).
        self.file.set_attrs(bytes_per_slot=self.store.nbytes / self.cfg.replay.capacity)
        self.exp_pool.close()
        if not self.local:
            for ring in self.replies:
                ring.close()
            self.req_pool.close()
        if self.params_out is not None:
            self.params_out.close()
        self.file.close()


def run_buffer(ctx: RoleContext, builder: ActorLearnerBuilder) -> None:
    """A buffer rank: the loop over what the algorithm's builder makes it serve from."""
    Buffer(ctx, builder).run()
