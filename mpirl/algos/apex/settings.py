"""Ape-X's settings: its ``[apex]`` section (n-step returns and the actors' exploration), and the keys of the
shared sections it reads."""

from __future__ import annotations

from dataclasses import dataclass

from mpirl import replay_job
from mpirl.domain import setting
from mpirl.replay_job import world_size  # noqa: F401 - the interface: the layout's default world size


@dataclass
class ApexConfig:
    # Actors send n-step transitions: the discounted sum of n rewards and the state n steps on.
    n_step: int = setting(3, ge=1, le=1000)
    # Exploration: actor i of N uses epsilon ** (1 + epsilon_alpha * i / (N - 1)); with several games per actor,
    # each game counts as one Ape-X actor (game j of actor i is i*k + j).
    epsilon: float = setting(0.4, ge=0, le=1)
    epsilon_alpha: float = setting(7.0, ge=0, le=1000)


SECTIONS = {"apex": ApexConfig}

USES = {
    **replay_job.USES,
    "agent": ("gamma", "lr", "adam_eps", "hidden", "network", "target_update", "grad_clip", "reward_clip", "device",
              "torch_threads", "precision"),
    "env": ("id", "envs_per_actor", "max_episode_steps", "channels", "frameskip", "frame_stack", "noop_max",
            "repeat_action_probability", "env_threads", "terminal_on_life_loss", "fire_on_life_loss"),
    "replay": ("architecture", "capacity", "batch_size", "alpha", "beta", "beta_final", "beta_steps",
               "learning_starts", "n_replay", "shares", "priority_eps", "samples_per_insert", "dedup_frames",
               "frame_cache"),
    "comm": ("send_batch", "send_ring", "recv_depth", "n_update", "prefetch", "max_message_mb", "link"),
}

# Keys that lived in a shared section before [apex] held them: a job that still sets one is told where it went.
MOVED = {"agent.n_step": "apex.n_step", "agent.epsilon": "apex.epsilon",
         "agent.epsilon_alpha": "apex.epsilon_alpha"}

DEFAULTS: dict[str, object] = {}  # the shared sections' defaults serve it


def check(cfg) -> None:
    """Ape-X's cross-field checks: the replay layout's."""
    replay_job.check(cfg)
