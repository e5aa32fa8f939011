"""The inference worker (DMCAF's actor-worker-learner; SEED RL's layout): it runs the policy for its actors.

Its actors only step their games: each sends the outcome of its last actions (``TAG_STEP``) and waits for
the next ones (``TAG_ACTIONS``). The worker keeps one receive posted per actor and answers every request
that is in with one batched forward pass, once ``topology.worker_batch`` requests are waiting, or the
oldest has waited ``topology.worker_deadline_us``, or every actor is waiting, whichever comes first.
Toward its buffer it is what an actor is without workers, with the actor loop's line to the buffer
(:class:`~mpirl.actor_learner.actor.Shipping`): it records the episodes (or transitions), sends them with the
experience layout, receives the versioned parameter broadcast, keeps within the insert budget (over it,
it holds its answers back and the actors wait), and its last message says goodbye. The stop in the
broadcast reaches each actor in the answer to its next request.

The worker knows nothing of the algorithm: it asks the algorithm's builder
(:class:`~mpirl.actor_learner.builder.ActorLearnerBuilder`) for the step rows, the actions' shape and the
decisions (:class:`~mpirl.actor_learner.builder.Deciding`, the same an actor holds for itself). An actor the
decisions hold (``holds``: it may not act with the parameters loaded, as in a synchronous round it has finished)
has its request observed and its answer wait for the next parameters.

Its file ``worker_<rank>.h5``: ``worker`` rows (steps served, forward passes and requests per pass,
the actors' request latency p50/p95 as they measured it, seconds in inference, parameter version) and
``actors`` rows (per actor: env steps, env steps/s, seconds waiting for actions, game failures).
"""

from __future__ import annotations

import math
import time

import numpy as np

from mpirl.comm.backoff import Backoff
from mpirl.comm.messages import TAG_ACTIONS, TAG_STEP, actions_layout, step_layout
from mpirl.comm.params import ParamFollower, param_channel
from mpirl.comm.pools import RecvPool, SendRing
from mpirl.metrics.writer import MetricsFile
from mpirl.actor_learner.actor import Shipping
from mpirl.actor_learner.builder import ActorLearnerBuilder
from mpirl.job.context import Interval, RoleContext
from mpirl.envs.outcomes import Outcome

F8, I8 = np.float64, np.int64


class Requests:
    """The actors' step messages: one receive posted per actor, the answers from a small ring per actor."""

    def __init__(self, comm, actors: int, step, actions):
        self.step, self.actions = step, actions
        self.pool = RecvPool(comm, list(range(1, actors + 1)), TAG_STEP, step.max_nbytes, depth=1)
        self.rings = [SendRing(comm, dest=a + 1, tag=TAG_ACTIONS, nbytes=actions.max_nbytes, size=2)
                      for a in range(actors)]
        self.pending: dict[int, tuple[int, np.ndarray, float]] = {}  # actor -> (pool slot, buffer, arrival)

    def poll(self) -> list[int]:
        """Actors whose request just came in."""
        now = time.perf_counter()
        new = []
        for slot, source, buf, _ in self.pool.poll():
            self.pending[source - 1] = (slot, buf, now)
            new.append(source - 1)
        return new

    def answer(self, actor: int, actions: np.ndarray | None, version: int, repost: bool = True) -> None:
        """Send ``actor`` its actions (None: the stop) and take its next request."""
        slot, buf, _ = self.pending.pop(actor)
        seq = self.step.get(buf, "seq")
        out_slot, out = self.rings[actor].acquire()
        if actions is None:
            nbytes = self.actions.pack(out, {}, seq=seq, stop=1, param_version=version)
        else:
            nbytes = self.actions.pack(out, {"actions": actions}, seq=seq, stop=0, param_version=version)
        self.rings[actor].send(out_slot, nbytes)
        if repost:
            self.pool.post(slot)

    def close(self) -> None:
        for ring in self.rings:
            ring.close()
        self.pool.close()


class WorkerMetrics:
    """``worker_<rank>.h5``: the worker's rows and its actors' rows."""

    def __init__(self, ctx: RoleContext, actors: list[int]):
        self.ctx, self.actors = ctx, actors
        self.file = MetricsFile(ctx.run_dir / f"worker_{ctx.topo.rank}.h5", flush_seconds=ctx.cfg.log.flush_seconds,
                                attrs={"role": "worker", "rank": ctx.topo.rank, "actors": actors,
                                       "worker_batch": ctx.cfg.topology.worker_batch,
                                       "worker_deadline_us": ctx.cfg.topology.worker_deadline_us},
                                resume=bool(ctx.resume))
        self.t_worker = self.file.table("worker", {
            "time": F8, "steps_served": I8, "requests": I8, "passes": I8, "batch_mean": F8, "batch_max": I8,
            "latency_p50_ms": F8, "latency_p95_ms": F8, "infer_s": F8, "param_version": I8, "throttled_s": F8})
        self.t_actors = self.file.table("actors", {
            "time": F8, "actor": I8, "env_steps": I8, "env_steps_per_s": F8, "wait_s": F8, "env_errors": I8})
        self.requests = self.passes = self.steps_served = 0
        self.infer_s = 0.0
        if ctx.resume:  # rows after the checkpoint go; the cumulative columns continue from the last kept row
            for table in (self.t_worker, self.t_actors):
                table.truncate(table.rows_until("time", ctx.resume.job_time))
            if self.t_worker.rows:
                last = {c: ds[self.t_worker.rows - 1] for c, ds in self.file.columns("worker").items()}
                self.requests, self.passes = int(last["requests"]), int(last["passes"])
                self.steps_served, self.infer_s = int(last["steps_served"]), float(last["infer_s"])
        self.tick = Interval(ctx.cfg.log.interval)
        self.latencies: list[float] = []
        self.sizes: list[int] = []
        self.last: dict[int, dict] = {}  # actor index -> its latest header values

    def served(self, ready: int, steps: int, seconds: float) -> None:
        self.sizes.append(ready)
        self.passes += 1
        self.requests += ready
        self.steps_served += steps
        self.infer_s += seconds

    def heard(self, a: int, layout, buf) -> None:
        latency = layout.get(buf, "latency_s")
        if latency > 0:
            self.latencies.append(latency)
        self.last[a] = {k: layout.get(buf, k) for k in ("env_steps", "steps_per_s", "wait_s", "env_errors")}

    def row(self, version: int, throttled: float, force: bool = False) -> None:
        if not (force or self.tick.due()):
            return
        t = self.ctx.now()
        lat = np.array(self.latencies) * 1e3
        p50, p95 = (np.percentile(lat, [50, 95]) if lat.size else (np.nan, np.nan))
        self.t_worker.append(time=t, steps_served=self.steps_served, requests=self.requests, passes=self.passes,
                             batch_mean=float(np.mean(self.sizes)) if self.sizes else np.nan,
                             batch_max=max(self.sizes, default=0), latency_p50_ms=p50, latency_p95_ms=p95,
                             infer_s=self.infer_s, param_version=version, throttled_s=throttled)
        for a, h in sorted(self.last.items()):
            self.t_actors.append(time=t, actor=self.actors[a], env_steps=int(h["env_steps"]),
                                 env_steps_per_s=h["steps_per_s"], wait_s=h["wait_s"], env_errors=int(h["env_errors"]))
        self.latencies.clear()
        self.sizes.clear()
        self.file.flush_if_due()

    def close(self) -> None:
        self.file.close()


class Worker:
    """One inference worker: its actors' requests, the decisions, the line to its buffer, its file.

    A worker rank runs it in :func:`run_worker`. With ``topology.workers = "learner"`` (DMCAF's AW) the
    learner holds one and calls :meth:`turn` between its train steps and while it waits for replies;
    it then loads its own parameters after each publish instead of receiving the broadcast."""

    def __init__(self, ctx: RoleContext, builder: ActorLearnerBuilder):
        cfg, topo = ctx.cfg, ctx.topo
        t = cfg.topology
        self.ctx = ctx
        self.actors = topo.served_by(topo.rank)
        m, self.E = len(self.actors), cfg.env.envs_per_actor
        self.step_lay = step_layout(builder.step_spec(ctx.spaces), self.E)
        self.requests = Requests(topo.serve, m, self.step_lay, actions_layout(builder.action_field(ctx.spaces), self.E))
        self.deciding = builder.make_deciding(ctx, self.actors)
        if ctx.resume:  # count on from the steps this worker had served before the checkpoint
            self.deciding.env_steps[:] = ctx.resume.actor_steps.get(topo.rank, 0) // max(m, 1)
        self.metrics = WorkerMetrics(ctx, self.actors)
        self.shipping = Shipping(ctx, self.deciding)  # the actor loop's line to the buffer, for all its actors
        self.deadline = t.worker_deadline_us * 1e-6
        self.most = t.worker_batch
        self.want = min(t.worker_batch, m)
        self.version = self.first = -1  # the parameters loaded (-1: none yet) and the first ones
        self.throttled_at: float | None = None  # when the insert budget started holding the answers back
        self.parked: dict[int, Outcome] = {}  # actors held by it: their observed outcome, not yet answered

    def load(self, params: np.ndarray, version: int) -> None:
        """Parameters ``version`` for the next passes; the first ones start the insert budget and the clock."""
        self.deciding.policy.load_flat(params)
        if self.first < 0:
            self.first, self.shipping.started = version, time.perf_counter()
            self.shipping.started_at = self.ctx.now()
        self.version = version

    @property
    def throttled(self) -> float:
        return self.shipping.throttled

    def env_errors(self) -> int:
        """The failures of the served actors' games, as their last messages said."""
        return sum(int(h["env_errors"]) for h in self.metrics.last.values())

    def _release(self) -> None:
        """The insert budget lets answers out again: its hold joins the seconds held back."""
        if self.throttled_at is not None:
            self.shipping.throttled += time.perf_counter() - self.throttled_at
            self.throttled_at = None

    def turn(self) -> float:
        """Take the requests that came in and answer one pass if it is due.

        Returns 0 after a pass, else how long the caller may wait before a pass can be due (the oldest
        request's deadline; ``inf`` when none waits or the insert budget holds the answers back)."""
        requests, metrics, d = self.requests, self.metrics, self.deciding
        for a in requests.poll():
            metrics.heard(a, self.step_lay, requests.pending[a][1])
        parked = self.parked
        if parked and all(self.deciding.holds(a) for a in parked):  # held actors wait for the next parameters
            candidates = [a for a in requests.pending if a not in parked]
        else:
            candidates = list(requests.pending)
        waiting = len(candidates)
        arrived = {a: requests.pending[a][2] for a in candidates}
        left = self.deadline - (time.perf_counter() - min(arrived.values())) if waiting else 0.0
        ready = waiting and (waiting >= min(self.want, len(self.actors) - len(parked)) or left <= 0 or
                             any(a in parked for a in candidates))
        if ready and self.shipping.over(self.version, self.first):
            if self.throttled_at is None:  # ahead of the learner: the actors wait until it publishes again
                self.throttled_at = time.perf_counter()
            metrics.row(self.version, self.throttled + time.perf_counter() - self.throttled_at)
            return math.inf
        self._release()
        if not ready:
            metrics.row(self.version, self.throttled)
            return left if waiting else math.inf
        t0 = time.perf_counter()
        # At most worker_batch requests a pass, the oldest first; the rest are next.
        order, outcomes = [], []
        for a in sorted(sorted(candidates, key=arrived.__getitem__)[:self.most]):
            if a in parked:  # observed when it was held: only its answer was left
                outcome = parked.pop(a)
            else:
                buf = requests.pending[a][1]
                outcome = Outcome(self.step_lay.views(buf), fresh=bool(self.step_lay.get(buf, "fresh")))
                d.observe(a, outcome)
            if self.deciding.holds(a):
                parked[a] = outcome
                continue
            order.append(a)
            outcomes.append(outcome)
        E = self.E
        if order:
            actions = d.decide(order, outcomes)
            for i, a in enumerate(order):
                requests.answer(a, actions[i * E:(i + 1) * E], self.version)
            metrics.served(len(order), len(order) * E, time.perf_counter() - t0)
        self.shipping.ship(self.version, self.env_errors())
        metrics.row(self.version, self.throttled)
        return 0.0

    def finish(self) -> None:
        """The stop: each actor learns it in the answer to its next request (nothing is reposted after it);
        unsent episodes are dropped (the learner has stopped), their returns reported, and goodbye."""
        requests = self.requests
        self._release()
        told: set[int] = set()
        wait = Backoff(first=20e-6, longest=2e-3)
        while len(told) < len(self.actors):
            requests.poll()
            for a in sorted(requests.pending):
                requests.answer(a, None, self.version, repost=False)
                told.add(a)
            if len(told) < len(self.actors):
                wait.sleep()
        self.shipping.goodbye(self.version, self.env_errors())
        self.metrics.row(self.version, self.throttled, force=True)
        requests.close()
        self.metrics.close()


def run_worker(ctx: RoleContext, builder: ActorLearnerBuilder) -> None:
    """A worker rank: the parameters from its buffer's broadcast, turns with back-off in between."""
    worker = Worker(ctx, builder)
    broadcast = param_channel(ctx.topo.group_params, ctx.n_params, ctx.topo.group_params_each)
    params = ParamFollower(broadcast, lambda flat: worker.load(flat, broadcast.version))
    params.start()  # the first parameters (or the stop)
    idle = Backoff(first=20e-6, longest=2e-3)
    held = Backoff(first=1e-4, longest=10e-3)  # as an actor held back by the budget waits: few wake-ups
    while not params.stopped:
        if params.poll() and params.stopped:
            break
        ctx.preempt.requested()  # a signal here: tell the learner, which stops the job
        wait = worker.turn()
        if worker.throttled_at is not None:  # until the learner publishes again
            held.sleep()
            continue
        held.reset()
        if wait == 0:
            idle.reset()
        elif wait < math.inf:  # a request waits for others: no longer than its deadline
            time.sleep(min(wait, 1e-3))
        else:
            idle.sleep()
    worker.finish()
