"""QMIX's trained policy: the team's shared agent network from a checkpoint, every agent greedy over its available
actions (epsilon 0, as the learner's test episodes play). An observation is the pair ``(obs [n, ...], avail [n, A])``
a :class:`~mpirl.envs.watched.TeamGame` gives (or a batch of pairs, ``[N, n, ...]`` each); the state carried
between steps is each agent's GRU state and last action."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mpirl.agents.deployed import TeamGreedy
from mpirl.agents.qmix_networks import AgentNet
from mpirl.agents.qmix_policy import agent_input_dim
from mpirl.agents.trained_policy import TrainedPolicy
from mpirl.algos.qmix.envs import Limit, env_kwargs, spaces_of
from mpirl.config import JobConfig
from mpirl.envs.watched import TeamGame
from mpirl.job.checkpoint import chosen, load


class TeamPolicy(TrainedPolicy):
    """Greedy joint actions of QMIX's agent network (see the module docstring)."""

    recurrent = True

    def __init__(self, cfg: JobConfig, agent_state: dict, device: torch.device | str = "cpu"):
        super().__init__(cfg, device)
        self.spaces = s = spaces_of(cfg)
        self.n_agents, self.n_actions, self.hidden = s.n_agents, s.n_actions, cfg.qmix.rnn_hidden
        self.obs_shape, self.obs_dtype = (s.n_agents, *s.obs_shape), np.dtype(s.obs_dtype)
        net = AgentNet(agent_input_dim(int(np.prod(s.obs_shape)), s.n_actions, s.n_agents), s.n_actions,
                       self.hidden)
        net.load_state_dict(agent_state)
        self.team = TeamGreedy(net, s.n_actions).to(self.device).eval()
        self.team.requires_grad_(False)

    def initial_state(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Each agent's GRU state and one-hot last action before any step of ``n`` games (zeros)."""
        return (np.zeros((n, self.n_agents, self.hidden), np.float32),
                np.zeros((n, self.n_agents, self.n_actions), np.float32))

    @torch.no_grad()
    def act(self, obs, state: Any = None, episode_start=None, deterministic: bool = True,
            rng: np.random.Generator | None = None) -> tuple[np.ndarray, Any]:
        o, avail = obs
        batch, one = self.batched(o)
        avail = np.asarray(avail, bool).reshape(len(batch), self.n_agents, self.n_actions)
        h, last = state if state is not None else self.initial_state(len(batch))
        if episode_start is not None:
            start = np.asarray(episode_start, bool).reshape(len(batch))
            h, last = np.where(start[:, None, None], 0.0, h), np.where(start[:, None, None], 0.0, last)
        t = lambda a: torch.as_tensor(np.asarray(a), device=self.device)  # noqa: E731
        a, h2 = self.team(t(batch), t(avail), t(last).float(), t(h).float())
        actions = a.cpu().numpy()
        state = (h2.cpu().numpy(), F.one_hot(a, self.n_actions).float().cpu().numpy())
        return (actions[0] if one else actions), state

    def game(self, seed: int, render: bool) -> TeamGame:
        from mpirl.envs.pettingzoo import make_team_env
        s, cfg = self.spaces, self.cfg
        kwargs = env_kwargs(cfg, Limit(s.episode_limit, s.limit_keyword))

        def make(rgb: bool):
            return make_team_env(cfg.env.id, seed, **kwargs, **({"render_mode": "rgb_array"} if rgb else {}))
        return TeamGame(make, cfg.env.id, s.episode_limit, render)

    def module(self) -> nn.Module:
        return self.team


def load_policy(cfg: JobConfig, run_dir: Path, checkpoint: Path | None, device: torch.device) -> TeamPolicy:
    path, source = chosen(run_dir, checkpoint)
    policy = TeamPolicy(cfg, load(path, map_location="cpu")["agent"]["agent"], device)
    policy.source = source
    return policy
