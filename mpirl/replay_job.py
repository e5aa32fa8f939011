"""What the replay-based algorithms' jobs (a learner, buffers, optional inference workers, actors) share in the
config layer: the keys of run, topology and checkpoint they read, their checks, their world size.
Their settings modules import it; standard library only (``mpirl.config`` is imported where it is used, as it
imports the settings)."""

from __future__ import annotations

import math

# The keys of the shared sections these algorithms read besides their own USES: stop conditions, the layout,
# checkpoints.
USES = {
    "run": ("train_steps", "env_steps", "wall_seconds", "target_return", "return_window", "return_from"),
    "topology": ("buffers", "actors", "node_local", "workers", "worker_batch", "worker_deadline_us"),
    "checkpoint": ("every_seconds", "every_steps", "keep", "replay"),
}


def world_size(cfg) -> int:
    """Ranks the job needs; with ``topology.actors = 0``, two actors per buffer (or per worker) by default."""
    t = cfg.topology
    return 1 + t.buffers + t.worker_ranks + (t.actors or 2 * (t.worker_ranks or t.buffers))


def check(cfg) -> None:
    """The checks every replay-based algorithm's job needs: a stop condition, and a learner-buffer-actor layout
    that can work (called from their settings' ``check``)."""
    from mpirl.config import ConfigError

    def _need(ok, key: str, message: str) -> None:
        if not ok:
            raise ConfigError(key, message)
    r, t, rp = cfg.run, cfg.topology, cfg.replay
    _need(r.train_steps or r.env_steps or r.wall_seconds, "run",
          "set at least one stop condition: run.train_steps, run.env_steps or run.wall_seconds")
    _need(t.buffers >= 1, "topology.buffers", "must be >= 1: the buffer ranks hold the replay (0, actors sending "
                                              "straight to the learner, is for agent.algorithm = \"impala\")")
    _need(not t.on_learner or t.buffers == 1, "topology.buffers",
          f"must be 1 with topology.workers = 'learner' (the learner's rank is the one worker and sends its "
          f"experience to one buffer), got {t.buffers}; set topology.buffers = 1, or use K worker ranks "
          f"(topology.workers = K >= {t.buffers})")
    _need(t.on_learner or t.workers == 0 or t.workers >= t.buffers, "topology.workers",
          f"must be 0 or >= topology.buffers ({t.buffers}) so each buffer has a worker sending to it, "
          f"got {t.workers}")
    _need(t.actors == 0 or t.actors >= (t.worker_ranks or t.buffers), "topology.actors",
          f"must be 0 (every remaining rank) or >= topology.{'workers' if t.worker_ranks else 'buffers'} "
          f"({t.worker_ranks or t.buffers}) so each {'worker' if t.worker_ranks else 'buffer'} has an actor, "
          f"got {t.actors}")
    _need(rp.batch_size >= t.buffers, "replay.batch_size",
          f"must be >= topology.buffers ({t.buffers}) so every buffer serves a share, got {rp.batch_size}")
    share = math.ceil(rp.batch_size / t.buffers)
    _need(rp.capacity >= share, "replay.capacity",
          f"must hold at least one batch share ({share}), got {rp.capacity}")
    _need(rp.learning_starts <= rp.capacity * t.buffers, "replay.learning_starts",
          f"must be between 0 and the total capacity {rp.capacity * t.buffers}, got {rp.learning_starts}")


def actor_count(cfg, size: int) -> int:
    """Actor ranks in a world of ``size`` ranks."""
    return cfg.topology.actors or size - 1 - cfg.topology.buffers - cfg.topology.worker_ranks


def check_world_size(cfg, size: int, job_path: str = "JOB.toml") -> None:
    """The MPI world must hold the learner, every buffer, every worker, and the job's actors (at least one per
    worker, or per buffer without workers)."""
    from mpirl.config import ConfigError
    t = cfg.topology
    fixed = 1 + t.buffers + t.worker_ranks
    roles = (f"1 learner{' (the worker)' if t.on_learner else ''} + {t.buffers} buffer(s)"
             + (f" + {t.worker_ranks} worker(s)" if t.worker_ranks else ""))
    per = "worker" if t.worker_ranks else "buffer"
    if t.actors:
        if size == fixed + t.actors:
            return
        need, what = fixed + t.actors, f"{roles} + {t.actors} actor(s)"
    else:
        if size >= fixed + (t.worker_ranks or t.buffers):
            return
        need, what = cfg.world_size, f"{roles} + at least one actor per {per}"
    hint = f"run: mpirl launch -n {need} {job_path}  (or mpiexec -n {need} mpirl run {job_path})"
    raise ConfigError("world size", f"the job needs {what}, the MPI world has {size} rank(s); {hint}")
