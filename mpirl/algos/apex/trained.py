"""Ape-X's trained policy: the learner's online Q-network from a checkpoint, acting greedily (epsilon 0)."""

from __future__ import annotations

from pathlib import Path

import torch

from mpirl.agents.deployed import GreedyActions
from mpirl.agents.networks import build_network
from mpirl.agents.trained_policy import SingleAgentPolicy
from mpirl.config import JobConfig
from mpirl.envs.actions import discrete
from mpirl.envs.factory import env_spaces
from mpirl.job.checkpoint import chosen, load


def load_policy(cfg: JobConfig, run_dir: Path, checkpoint: Path | None, device: torch.device
                ) -> SingleAgentPolicy:
    path, source = chosen(run_dir, checkpoint)
    obs_shape, obs_dtype, n_actions = env_spaces(cfg.env)
    net = build_network(obs_shape, n_actions, cfg.agent.hidden, cfg.agent.network)
    net.load_state_dict(load(path, map_location="cpu")["online"])
    policy = SingleAgentPolicy(cfg, GreedyActions(net), obs_shape, obs_dtype, discrete(n_actions), device=device)
    policy.source = source
    return policy
