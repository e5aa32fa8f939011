"""The gradient family's trained policy (A3C, DPPO, DD-PPO): the model's actor-critic and observation statistics
from a checkpoint (the server's, or under allreduce the first worker's)."""

from __future__ import annotations

from pathlib import Path

import torch

from mpirl.agents.trained_actor_critic import actor_critic_policy
from mpirl.agents.trained_policy import SingleAgentPolicy
from mpirl.config import JobConfig
from mpirl.job.checkpoint import chosen, load


def load_policy(cfg: JobConfig, run_dir: Path, checkpoint: Path | None, device: torch.device
                ) -> SingleAgentPolicy:
    path, source = chosen(run_dir, checkpoint)
    policy = actor_critic_policy(cfg, load(path, map_location="cpu")["model"], device)
    policy.source = source
    return policy
