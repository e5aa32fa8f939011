"""Actor overhead: env steps/s of an actor rank that sends its experiences vs the same loop without MPI.

    mpirl bench actor [--reps 5]

The loop is the actor's own (:class:`mpirl.actor_learner.actor.Acting` over Ape-X's games and decisions): epsilon-greedy
actions from the local network, n-step transitions, initial priorities from the
local network for every batch, one torch thread. An actor rank (``mpiexec -n 2``,
rank 1) runs it in alternating halves of each repetition: without MPI (batches
dropped once their priorities are computed; no MPI call at all) and with every
batch packed into the send ring and sent to rank 0, which receives as a buffer
does. Alternating in one process keeps drifts of the machine out of the ratio.
CartPole (one game per actor, the cheapest env: MPI's share is largest) and
Breakout (four games in ale-py's vector env).
"""

from __future__ import annotations

import torch

from mpirl.agents.dqn import transition_spec
from mpirl.bench.report import MIN_REPS, Row
from mpirl.bench.run_mpi import mpiexec_json
from mpirl.config import JobConfig
from mpirl.envs.vector import vector_spaces
from mpirl.algos.apex.algorithm import Spaces
from mpirl.algos.apex.serving import ApexDeciding, ApexGames
from mpirl.actor_learner.actor import Acting

ENVS = [("CartPole-v1", 1), ("ALE/Breakout-v5", 4)]


def acting_for(env_id: str, envs: int) -> tuple[Acting, JobConfig, dict]:
    """An actor's acting loop for ``env_id`` with ``envs`` games, as actor 0 of 2 of a default job."""
    torch.set_num_threads(1)
    cfg = JobConfig()
    cfg.env.id, cfg.env.envs_per_actor = env_id, envs
    if env_id.startswith("ALE/"):
        cfg.agent.hidden, cfg.agent.reward_clip, cfg.comm.send_batch = [512], 1.0, 64
    obs_shape, obs_dtype, n_actions = vector_spaces(cfg.env)
    spec = transition_spec(obs_shape, obs_dtype)
    spaces = Spaces(obs_shape, obs_dtype, n_actions)
    acting = Acting(ApexGames(cfg, spaces, 1, "bench"), ApexDeciding(cfg, spaces, spec, [1], [0], 2))
    return acting, cfg, spec


def receive_until_final(comm, env_id: str, envs: int) -> int:
    """Rank 0: receive experience messages like a buffer until the actor's final one; returns the count."""
    from mpirl.comm.backoff import Backoff
    from mpirl.comm.messages import TAG_EXPERIENCE, experience_layout
    from mpirl.comm.pools import RecvPool
    from mpirl.replay.frames import framed_fields
    cfg = JobConfig()
    cfg.env.id, cfg.env.envs_per_actor = env_id, envs
    batch = 64 if env_id.startswith("ALE/") else cfg.comm.send_batch
    obs_shape, obs_dtype, _ = vector_spaces(cfg.env)
    spec = transition_spec(obs_shape, obs_dtype)
    framed = framed_fields(spec) if cfg.replay.dedup_frames else {}
    layout = experience_layout(spec, batch, framed, envs)  # frames once for Atari, as the actor sends
    pool = RecvPool(comm, [1], TAG_EXPERIENCE, layout.max_nbytes, cfg.comm.recv_depth)
    backoff, got, final = Backoff(), 0, False
    while not final:
        done = pool.poll()
        if not done:
            backoff.sleep()
            continue
        backoff.reset()
        for slot, _src, buf, _n in done:
            got += 1
            final = final or bool(layout.get(buf, "final"))
            if not final:
                pool.post(slot)
    pool.close()
    return got


def run(reps: int = MIN_REPS, seconds: float = 1.0) -> list[Row]:
    rows = []
    for env_id, envs in ENVS:
        if env_id.startswith("ALE/"):
            try:
                import ale_py  # noqa: F401
            except ImportError:
                continue
        r = Row(f"actor {env_id} x{envs}", "env steps/s", "actor rank sending (MPI)", "same loop, no MPI", target=0.9)
        out = mpiexec_json("actor", {"env": env_id, "envs": envs, "seconds": seconds, "reps": reps},
                           timeout=300 + 2 * seconds * (reps + 1))  # a hang's: a loaded start-up takes minutes
        r.values[r.reference], r.values[r.ours] = out["rates"]["bare"], out["rates"]["send"]
        rows.append(r)
    return rows
