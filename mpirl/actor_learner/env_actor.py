"""An actor served by an inference worker (:mod:`mpirl.actor_learner.worker`): it steps its games and nothing else.

Per step it packs the outcome of its last actions into a step message (``Isend`` from a ring of two),
waits with back-off polling for the worker's answer, and plays the actions it gets. The answer that
carries ``stop`` ends it; it then sends nothing more. It reports its env steps, their rate, the
seconds it spent waiting for actions and the round trip of its last request in each message's header;
the worker records them. Its games come from the algorithm's builder (``make_games``).
"""

from __future__ import annotations

import time
from mpirl.comm.backoff import Backoff
from mpirl.comm.messages import TAG_ACTIONS, TAG_STEP, actions_layout, step_layout
from mpirl.comm.pools import RecvPool, SendRing
from mpirl.job.context import RoleContext
from mpirl.actor_learner.builder import ActorLearnerBuilder


def run_env_actor(ctx: RoleContext, builder: ActorLearnerBuilder) -> None:
    cfg, topo = ctx.cfg, ctx.topo
    E = cfg.env.envs_per_actor
    step_lay = step_layout(builder.step_spec(ctx.spaces), E)
    act_lay = actions_layout(builder.action_field(ctx.spaces), E)
    ring = SendRing(topo.serve, dest=0, tag=TAG_STEP, nbytes=step_lay.max_nbytes, size=2)
    answers = RecvPool(topo.serve, [0], TAG_ACTIONS, act_lay.max_nbytes, depth=1)
    games = builder.make_games(ctx, f"actor rank {topo.rank}")
    env_steps, wait_s, latency, seq = 0, 0.0, 0.0, 0
    outcome = games.start()
    started = time.perf_counter()
    # An answer comes within a pass or two (about 1-25 ms); while the worker is held back by the insert budget
    # it comes much later, and wake-ups every millisecond from every actor would take the learner's CPU.
    backoff = Backoff(first=10e-6, longest=4e-3)
    try:
        while True:
            ctx.preempt.requested()  # a signal here: tell the learner, which stops the job
            slot, buf = ring.acquire()
            seq += 1
            elapsed = max(time.perf_counter() - started, 1e-9)
            nbytes = step_lay.pack(buf, outcome.rows, seq=seq, fresh=int(outcome.fresh), env_steps=env_steps,
                                   steps_per_s=env_steps / elapsed, wait_s=wait_s, latency_s=latency,
                                   env_errors=games.env_errors)
            t0 = time.perf_counter()
            ring.send(slot, nbytes)
            backoff.reset()
            got = answers.poll()
            while not got:
                backoff.sleep()
                got = answers.poll()
            latency = time.perf_counter() - t0
            wait_s += latency
            (_, _, reply, _), = got
            if act_lay.get(reply, "stop"):
                break
            actions = act_lay.views(reply)["actions"].copy()
            answers.post(0)
            outcome = games.step(actions)
            env_steps += E
    finally:
        games.close()
    ring.close()
    answers.close()
