"""IMPALA's settings: the ``[impala]`` section, and the keys of the shared sections it reads.

A queue is a memory of trajectory slots, so IMPALA reads two keys of ``[replay]`` in that sense:
``replay.capacity``, the trajectories one buffer's queue holds (a full queue holds its actors back), and
``replay.batch_size``, the trajectories of one train batch (each queue serves its even share). With them the
learner's remote sources and the buffer loop serve IMPALA as they serve the replay algorithms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpirl import replay_job
from mpirl.domain import ConfigError, Domain, setting
from mpirl.sections import check_recurrent, check_schedules


@dataclass
class ImpalaConfig:
    # Steps of one trajectory (of one game); each trajectory also carries the observation after its last step.
    unroll: int = setting(20, ge=1, le=100_000)
    # V-trace's truncation levels (Espeholt et al. 2018, section 4.1) and its lambda.
    rho_bar: float = setting(1.0, gt=0, le=1e6)
    c_bar: float = setting(1.0, gt=0, le=1e6)
    lam: float = setting(1.0, ge=0, le=1, why="V-trace's lambda")
    # The loss: policy gradient + value_coef x value loss - entropy_coef x entropy.
    value_coef: float = setting(0.5, ge=0, le=1e6)
    entropy_coef: float = setting(0.01, ge=0, le=1e6)
    # Linear from entropy_coef to entropy_final over agent.schedule_steps (nan: constant; mpirl.agents.schedules).
    entropy_final: float = setting(math.nan, ge=0, le=1e6, nan=True, why="nan: constant")
    # The survey's switch. "async" (IMPALA): the learner trains on whatever trajectories have arrived and actors
    # never wait for parameters, only for room in their queue. "sync" (A2C-style rounds): every actor acts one
    # trajectory per game with the current parameters, the learner trains on that round (replay.batch_size = actors
    # x env.envs_per_actor) and broadcasts, and the actors wait for it; V-trace then sees no lag.
    exchange: str = setting("async", choices=("async", "sync"))
    # Microseconds added to each step of an actor's games: one value for every actor, or one per actor (the
    # survey's straggler: a slow actor holds every round back under "sync").
    actor_delay_us: list = setting([0], items=Domain(ge=0, le=10**9), why="one for all, or one per actor")
    # The learner plays test_episodes episodes with its policy (actions sampled, as the actors act) every test_every
    # train steps (0: only at the stop) and at the stop, into learner.h5's test table.
    test_episodes: int = setting(10, ge=0, le=100_000, why="0: no test episodes")
    test_every: int = setting(0, ge=0, le=10**9, why="train steps between test rounds; 0: only at the stop")
    # Experience replay as in IMPALA's experiments (section 5.2.3): replay_share of every batch is drawn uniformly
    # from the last replay_capacity trajectories each queue served, the rest are fresh (oldest first, each once).
    replay_share: float = setting(0.0, ge=0, lt=1, why="the share of a batch drawn from the replay; 0: none")
    replay_capacity: int = setting(0, ge=0, le=10**7, why="trajectories each queue keeps for replay; 0: none")
    # Each reward times reward_scale (after agent.reward_clip) in what the learner trains on; the episodes' returns
    # stay the environment's. Keeps the value loss of long -1-per-step episodes (Acrobot) from swamping the shared
    # layers; Sample Factory's reward_scale.
    reward_scale: float = setting(1.0, gt=0, le=1e6)
    # IMPALA's optimizer is RMSProp (alpha 0.99, epsilon 0.01); Adam uses agent.adam_eps.
    optimizer: str = setting("adam", choices=("adam", "rmsprop"))
    rmsprop_alpha: float = setting(0.99, gt=0, lt=1)
    rmsprop_eps: float = setting(0.01, gt=0, le=1)


SECTIONS = {"impala": ImpalaConfig}

USES = {
    "run": replay_job.USES["run"],
    "topology": ("buffers", "actors", "node_local", "workers", "worker_batch", "worker_deadline_us"),
    "checkpoint": ("every_seconds", "every_steps", "keep"),
    "agent": ("gamma", "lr", "adam_eps", "hidden", "network", "activation", "shared_torso", "log_std_init",
              "recurrent", "weight_init", "normalize_obs", "normalize_reward", "normalized_obs_clip",
              "normalized_reward_clip", "lr_final", "schedule_unit", "schedule_steps",
              "grad_clip", "reward_clip", "device", "torch_threads"),
    "env": ("id", "envs_per_actor", "max_episode_steps", "channels", "frameskip", "frame_stack", "noop_max",
            "repeat_action_probability", "env_threads", "terminal_on_life_loss", "fire_on_life_loss"),
    "replay": ("capacity", "batch_size"),
    "comm": ("send_ring", "recv_depth", "n_update", "prefetch", "max_message_mb", "link"),
}

MOVED: dict[str, str] = {}  # no key of a shared section has moved into [impala]

# Rewards divided by the spread of the discounted return: what keeps a policy-gradient step's size independent of
# the rewards' scale (LunarLander's crash of -100 took the unscaled policy to one action within seconds).
DEFAULTS: dict[str, object] = {"agent.normalize_reward": True}


def world_size(cfg) -> int:
    """Ranks the job needs; with ``topology.actors = 0``, two actors per queue (or per worker), two with the queue
    on the learner (``topology.buffers = 0``)."""
    t = cfg.topology
    return 1 + t.buffers + t.worker_ranks + (t.actors or 2 * (t.worker_ranks or max(t.buffers, 1)))


def replayed(cfg, queues: int) -> int:
    """Trajectories of one queue's share of a batch drawn from its replay (``impala.replay_share`` of the share,
    rounded down)."""
    share = -(-cfg.replay.batch_size // max(queues, 1))
    return int(share * cfg.impala.replay_share) if cfg.impala.replay_capacity else 0


def fresh_batch(cfg, queues: int) -> int:
    """Fresh trajectories a batch takes from the queues once their replays are warm (each queue: its share less
    what it replays); before that, a batch is all fresh."""
    return cfg.replay.batch_size - queues * replayed(cfg, queues)


def check(cfg) -> None:
    """IMPALA's cross-field checks: a stop condition, the layout, and queues that can serve a batch."""
    r, t, rp = cfg.run, cfg.topology, cfg.replay
    if not (r.train_steps or r.env_steps or r.wall_seconds):
        raise ConfigError("run", "set at least one stop condition: run.train_steps, run.env_steps or "
                                 "run.wall_seconds")
    check_schedules(cfg, {"agent.lr_final": cfg.agent.lr_final, "impala.entropy_final": cfg.impala.entropy_final})
    check_recurrent(cfg)
    if t.buffers == 0 and t.served:
        raise ConfigError("topology.workers", "inference workers with topology.buffers = 0 (the queue on the "
                                              "learner) are not supported yet; set topology.workers = 0 or "
                                              "topology.buffers >= 1")
    if t.buffers == 0 and (cfg.comm.link.bandwidth_gbps or cfg.comm.link.latency_ms):
        raise ConfigError("comm.link", "emulates the link between the learner and its buffers, and "
                                       "topology.buffers = 0 has none (the queue is the learner's); unset comm.link "
                                       "or set topology.buffers >= 1")
    if t.on_learner and t.buffers != 1:
        raise ConfigError("topology.buffers", f"must be 1 with topology.workers = 'learner' (the learner's rank is "
                                              f"the one worker and sends to one queue), got {t.buffers}")
    if t.worker_ranks and t.worker_ranks < t.buffers:
        raise ConfigError("topology.workers", f"must be 0 or >= topology.buffers ({t.buffers}) so each queue has a "
                                              f"worker sending to it, got {t.workers}")
    if t.actors and t.actors < (t.worker_ranks or t.buffers):
        raise ConfigError("topology.actors", f"must be 0 (every remaining rank) or >= topology."
                                             f"{'workers' if t.worker_ranks else 'buffers'} "
                                             f"({t.worker_ranks or t.buffers}) so each has an actor, got {t.actors}")
    queues = max(t.buffers, 1)  # buffers = 0: the one queue is the learner's
    if rp.batch_size < t.buffers:
        raise ConfigError("replay.batch_size", f"trajectories per batch must be >= topology.buffers ({t.buffers}) "
                                               f"so every queue serves a share, got {rp.batch_size}")
    share = -(-rp.batch_size // queues)
    if rp.capacity < 2 * share:
        raise ConfigError("replay.capacity", f"a queue must hold at least two batch shares ({2 * share} "
                                             f"trajectories: one being served, one filling), got {rp.capacity}")
    if cfg.impala.exchange == "sync" and cfg.comm.n_update != 1:
        raise ConfigError("comm.n_update", f"must be 1 with impala.exchange = \"sync\": each round is trained on "
                                           f"and broadcast before the next is acted, got {cfg.comm.n_update}")
    if rp.batch_size % queues:
        raise ConfigError("replay.batch_size", f"trajectories per batch must be a multiple of topology.buffers "
                                               f"({t.buffers}): each queue serves an equal share, got {rp.batch_size}")
    i = cfg.impala
    if (i.replay_share > 0) != (i.replay_capacity > 0):
        key = "impala.replay_capacity" if i.replay_share > 0 else "impala.replay_share"
        raise ConfigError(key, f"experience replay needs both impala.replay_share > 0 and impala.replay_capacity > 0 "
                               f"(got {i.replay_share:g} and {i.replay_capacity}); set both, or both to 0")
    if i.replay_share > 0:
        if i.exchange == "sync":
            raise ConfigError("impala.replay_share", "must be 0 with impala.exchange = \"sync\": a synchronous "
                                                     "batch is one round of fresh trajectories")
        if not replayed(cfg, queues):
            raise ConfigError("impala.replay_share", f"{i.replay_share:g} of a queue's share of {share} trajectories "
                                                     f"is less than one; raise it to at least {1 / share:.3g} or "
                                                     f"raise replay.batch_size")
        if i.replay_capacity < share:
            raise ConfigError("impala.replay_capacity", f"must hold at least a queue's share of a batch ({share} "
                                                        f"trajectories), got {i.replay_capacity}")
    if rp.capacity < cfg.env.envs_per_actor:
        raise ConfigError("replay.capacity", f"a queue must hold one actor's message (env.envs_per_actor = "
                                             f"{cfg.env.envs_per_actor} trajectories), got {rp.capacity}")
