"""QMIX's settings: the ``[qmix]`` section, and the keys of the shared sections it reads.

QMIX = ``loss_weights = "none"`` with ``sampler = "uniform"``; MAC-PO = ``"macpo"`` with
``"uniform"``; AccMER = ``"macpo"`` with ``"accmer"``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpirl import replay_job
from mpirl.replay_job import world_size  # noqa: F401 - the interface: the layout's default world size
from mpirl.domain import ConfigError, setting


@dataclass
class QmixConfig:
    # TD(lambda) targets over the episode (PyMARL2/EPyMARL use 0.6 with QMIX).
    td_lambda: float = setting(0.6, ge=0, le=1)
    # Each actor's epsilon falls linearly over its own env steps (its games together), as PyMARL's schedule.
    epsilon_start: float = setting(1.0, ge=0, le=1)
    epsilon_finish: float = setting(0.05, ge=0, le=1)
    epsilon_anneal_steps: int = setting(50_000, ge=1, why="env steps of one actor")
    rnn_hidden: int = setting(64, ge=1, le=65_536)
    mixer_embed: int = setting(32, ge=1, le=65_536)
    hypernet_hidden: int = setting(64, ge=1, le=65_536)
    # MAC-PO's central mixer Q* (feed-forward over the state and the agents' chosen Q-values).
    central_hidden: int = setting(256, ge=1, le=65_536)
    # "macpo": each step's squared TD error weighted by |Q_tot - y| exp(-|Q_tot - Q*|) f(pi) (AccMER Eqs. 1-3).
    loss_weights: str = setting("none", choices=("none", "macpo"))
    # The learner plays this many greedy episodes (epsilon 0) every test_every train steps and at the end.
    test_episodes: int = setting(32, ge=1, le=100_000)
    test_every: int = setting(1_000, ge=1, why="train steps between greedy test rounds")
    # Episode replay: "uniform" picks, or AccMER's reuse of the highest-weight episodes for a window of
    # floor(d / b) train steps plus (1 - accmer_alpha) * b uniform picks (needs loss_weights = "macpo").
    sampler: str = setting("uniform", choices=("uniform", "accmer"))
    accmer_alpha: float = setting(0.5, ge=0, le=1, why="the reused share of a batch")
    accmer_discount: float = setting(0.8, gt=0, le=1, why="every weight is multiplied by it after each step")


SECTIONS = {"qmix": QmixConfig}

USES = {
    **replay_job.USES,
    "agent": ("gamma", "lr", "adam_eps", "target_update", "grad_clip", "device", "torch_threads"),
    "env": ("id", "envs_per_actor", "max_episode_steps", "predator_prey"),
    "replay": ("architecture", "capacity", "batch_size", "learning_starts", "n_replay", "samples_per_insert"),
    "comm": ("send_batch", "send_ring", "recv_depth", "n_update", "prefetch", "max_message_mb", "link"),
}

# Keys that lived in a shared section before [qmix] held them: a job that still sets one is told where it went.
MOVED = {"replay.sampler": "qmix.sampler", "replay.accmer_alpha": "qmix.accmer_alpha",
         "replay.accmer_discount": "qmix.accmer_discount"}

DEFAULTS: dict[str, object] = {}  # the shared sections' defaults serve it


def check(cfg) -> None:
    """QMIX's cross-field checks (no MPI, no torch)."""
    replay_job.check(cfg)
    rp, q = cfg.replay, cfg.qmix
    if q.sampler == "accmer" and q.loss_weights != "macpo":
        raise ConfigError("qmix.sampler", "'accmer' ranks episodes by their MAC-PO weights; set "
                                          "qmix.loss_weights = \"macpo\" (AccMER = macpo + accmer)")
    if q.sampler == "accmer" and cfg.topology.learners > 1:
        raise ConfigError("qmix.sampler", f"cannot be 'accmer' with topology.learners = {cfg.topology.learners}: "
                                          "AccMER's reuse window counts the batches a shard serves, and each "
                                          "learner's part would count as one (serving a batch's parts as one draw "
                                          "is not built yet); set qmix.sampler = \"uniform\" or "
                                          "topology.learners = 1")
    if q.epsilon_finish > q.epsilon_start:
        raise ConfigError("qmix.epsilon_finish", f"must be <= qmix.epsilon_start ({q.epsilon_start}), "
                                                 f"got {q.epsilon_finish}")
    crowded = cfg.env.predator_prey.crowding() if cfg.env.id == "predator_prey" else None
    if crowded:
        raise ConfigError(*crowded)
    share = -(-rp.batch_size // cfg.topology.buffers)
    if rp.learning_starts < rp.batch_size:
        raise ConfigError("replay.learning_starts", f"episodes held before sampling must be >= replay.batch_size "
                                                    f"({rp.batch_size}) so a batch of distinct episodes can be "
                                                    f"drawn, got {rp.learning_starts}")
    if rp.capacity < share:
        raise ConfigError("replay.capacity", f"a memory must hold at least one batch share ({share} episodes): "
                                             f"b > d; got {rp.capacity}")
