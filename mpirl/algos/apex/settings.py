"""Ape-X's settings: it owns no section of its own and reads these keys of the shared ones."""

from __future__ import annotations

from mpirl import replay_job
from mpirl.replay_job import world_size  # noqa: F401 - the interface: the layout's default world size

SECTIONS: dict = {}

USES = {
    **replay_job.USES,
    "agent": ("gamma", "n_step", "lr", "adam_eps", "hidden", "target_update", "grad_clip", "reward_clip",
              "epsilon", "epsilon_alpha", "device", "torch_threads", "precision"),
    "env": ("id", "envs_per_actor", "max_episode_steps", "frameskip", "frame_stack", "noop_max",
            "repeat_action_probability", "env_threads", "terminal_on_life_loss", "fire_on_life_loss"),
    "replay": ("architecture", "capacity", "batch_size", "alpha", "beta", "beta_final", "beta_steps",
               "learning_starts", "n_replay", "shares", "priority_eps", "samples_per_insert", "dedup_frames"),
    "comm": ("send_batch", "send_ring", "recv_depth", "n_update", "prefetch", "max_message_mb", "link"),
}


def check(cfg) -> None:
    """Ape-X's cross-field checks: the replay layout's."""
    replay_job.check(cfg)
