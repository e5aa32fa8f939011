"""An actor-critic's trained policy from its checkpoint state (IMPALA's learner, the gradient family's model): the
network ``[agent]`` describes, its parameters and the job's observation statistics as they stood."""

from __future__ import annotations

import torch

from mpirl.agents.actor_critic import actor_critic
from mpirl.agents.deployed import ModeActions, RecurrentModeActions
from mpirl.agents.running_stats import normalization
from mpirl.agents.tensors import as_arrays
from mpirl.agents.trained_policy import SingleAgentPolicy
from mpirl.envs.factory import policy_env_spaces


def actor_critic_policy(cfg, state: dict, device: torch.device) -> SingleAgentPolicy:
    """``state``: a checkpoint's ``net`` (the network's state dict) and ``normalization`` (the statistics)."""
    obs_shape, obs_dtype, spec = policy_env_spaces(cfg.env)
    net = actor_critic(tuple(obs_shape), spec, cfg.agent)
    net.load_state_dict(state["net"])
    net.requires_grad_(False)
    norm = normalization(tuple(obs_shape), cfg.agent, obs_dtype=obs_dtype)
    norm.restore(as_arrays(state.get("normalization", {})))
    module = (RecurrentModeActions if net.core is not None else ModeActions)(net, spec, norm)
    return SingleAgentPolicy(cfg, module, obs_shape, obs_dtype, spec, net=net, device=device)
