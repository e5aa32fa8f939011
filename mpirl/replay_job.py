"""What the replay-based algorithms' jobs (a learner, buffers, optional inference workers, actors) share in the
config layer: the keys of run, topology and checkpoint they read, their checks, their world size.
Their settings modules import it; standard library only (``mpirl.config`` is imported where it is used, as it
imports the settings)."""

from __future__ import annotations

import math

from mpirl.domain import ConfigError

# The keys of the shared sections these algorithms read besides their own USES: stop conditions, the layout,
# checkpoints.
USES = {
    "run": ("train_steps", "env_steps", "wall_seconds", "target_return", "return_window", "return_from"),
    "topology": ("learners", "buffers", "actors", "node_local", "workers", "worker_batch", "worker_deadline_us"),
    "checkpoint": ("every_seconds", "every_steps", "keep", "replay"),
}


def world_size(cfg) -> int:
    """Ranks the job needs; with ``topology.actors = 0``, two actors per buffer (or per worker) by default."""
    t = cfg.topology
    return t.learners + t.buffers + t.worker_ranks + (t.actors or 2 * (t.worker_ranks or t.buffers))


def check(cfg) -> None:
    """The checks every replay-based algorithm's job needs: a stop condition, and a learner-buffer-actor layout
    that can work (called from their settings' ``check``)."""
    check_learners(cfg)

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
    t = cfg.topology
    return t.actors or size - t.learners - t.buffers - t.worker_ranks


def learners(t) -> str:
    """'1 learner', '2 learners': for descriptions and messages."""
    return f"{t.learners} learner{'s' if t.learners > 1 else ''}"


def check_learners(cfg) -> None:
    """``topology.learners = K > 1`` (data-parallel learners; Ape-X and QMIX read the key, the others refuse it as
    one they do not read). Each learner draws its 1/K of every batch, so K <= batch size; what is not built with
    K > 1 says so."""
    t, rp = cfg.topology, cfg.replay
    if t.learners == 1:
        return
    for ok, key, value, why, how in (
            (rp.shares == "even", "replay.shares", rp.shares, "each learner's share of a buffer must be fixed for "
             "the learners' gradients to add up to one batch's", 'replay.shares = "even"'),
            (rp.frame_cache == 0, "replay.frame_cache", rp.frame_cache, "a buffer mirrors one learner's frame cache",
             "replay.frame_cache = 0"),
            (not t.on_learner, "topology.workers", t.workers, "the inference worker on the learner's rank serves "
             "one learner", "topology.workers = 0 or K worker ranks")):
        if not ok:
            raise ConfigError(key, f"cannot be {value!r} with topology.learners = {t.learners}: {why}; set "
                                   f"topology.learners = 1, or {how}")
    if t.learners > rp.batch_size:
        raise ConfigError("topology.learners", f"must be <= replay.batch_size ({rp.batch_size}): each learner trains "
                                               f"its 1/K of every batch (the first batch_size % K one row more), "
                                               f"got {t.learners}")


def check_world_size(cfg, size: int, job_path: str = "JOB.toml") -> None:
    """The MPI world must hold the learner, every buffer, every worker, and the job's actors (at least one per
    worker, or per buffer without workers)."""
    t = cfg.topology
    fixed = t.learners + t.buffers + t.worker_ranks
    roles = (f"{learners(t)}{' (the worker)' if t.on_learner else ''} + {t.buffers} buffer(s)"
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
