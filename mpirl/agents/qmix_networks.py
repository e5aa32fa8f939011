"""QMIX's networks: the recurrent agent network shared by all agents (with agent-id and last-action inputs),
the monotonic hypernetwork mixer, and MAC-PO's feed-forward central mixer; no MPI, no config."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mpirl.agents.tensors import floats

# What PyMARL writes into unavailable actions' Q-values before a max/argmax.
UNAVAILABLE = -9999999.0


def agent_inputs(obs: torch.Tensor, last_onehot: torch.Tensor) -> torch.Tensor:
    """Each agent's network input ``[..., n, obs_dim + A + n]``, for acting and training alike.

    ``obs`` ``[..., n, obs_dim]`` (flat, any dtype: taken as the networks' floats as it is), ``last_onehot`` ``[..., n, A]``
    the one-hot action each agent took on the previous step (zeros on an episode's first step).
    """
    n = obs.shape[-2]
    ids = torch.eye(n, device=obs.device).expand(*obs.shape[:-1], n)
    return torch.cat([floats(obs), floats(last_onehot), ids], dim=-1)


def last_action_onehot(actions: torch.Tensor, n_actions: int) -> torch.Tensor:
    """``actions`` ``[B, T+1, n]`` -> the previous step's one-hot action ``[B, T+1, n, A]`` (zeros at t = 0)."""
    onehot = floats(F.one_hot(actions[:, :-1], n_actions))
    return torch.cat([torch.zeros_like(onehot[:, :1]), onehot], dim=1)


class AgentNet(nn.Module):
    """fc -> ReLU -> GRU -> fc to one Q-value per action; one network shared by all agents.

    The recurrent layer is a one-layer ``nn.GRU``: the same equations and parameters as PyMARL's
    ``GRUCell``, but a whole episode runs in one call (5x faster backward on the CPU than a Python
    loop of cells). ``step`` runs one time step (acting), ``sequence`` a batch of whole episodes.
    """

    def __init__(self, input_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.hidden = hidden
        self.fc1 = nn.Linear(input_dim, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.fc2 = nn.Linear(hidden, n_actions)

    def step(self, inputs: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``inputs`` ``[N, D]``, hidden ``[N, H]`` -> (Q ``[N, A]``, new hidden ``[N, H]``)."""
        x = F.relu(self.fc1(inputs)).unsqueeze(1)
        out, h_new = self.rnn(x, h.unsqueeze(0).contiguous())
        return self.fc2(out.squeeze(1)), h_new.squeeze(0)

    def sequence(self, inputs: torch.Tensor) -> torch.Tensor:
        """``inputs`` ``[N, T, D]`` from a zero hidden state -> Q ``[N, T, A]``."""
        out, _ = self.rnn(F.relu(self.fc1(inputs)))
        return self.fc2(out)

    forward = sequence


class QMixer(nn.Module):
    """Monotonic mixing: Q_tot = elu(q W1 + b1) W2 + V(s), W1 and W2 non-negative (abs), all from the state.

    Two-layer hypernetworks (width ``hypernet_hidden``) make W1 ``[n, embed]`` and W2 ``[embed, 1]``;
    one layer makes b1; V(s) has one hidden layer of width ``embed``.
    """

    def __init__(self, n_agents: int, state_dim: int, embed: int = 32, hypernet_hidden: int = 64):
        super().__init__()
        self.n_agents, self.state_dim, self.embed = n_agents, state_dim, embed
        self.hyper_w1 = nn.Sequential(nn.Linear(state_dim, hypernet_hidden), nn.ReLU(),
                                      nn.Linear(hypernet_hidden, n_agents * embed))
        self.hyper_b1 = nn.Linear(state_dim, embed)
        self.hyper_w2 = nn.Sequential(nn.Linear(state_dim, hypernet_hidden), nn.ReLU(),
                                      nn.Linear(hypernet_hidden, embed))
        self.value = nn.Sequential(nn.Linear(state_dim, embed), nn.ReLU(), nn.Linear(embed, 1))

    def forward(self, agent_qs: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """``agent_qs`` ``[..., n]``, ``states`` ``[..., state_dim]`` -> Q_tot ``[...]``."""
        lead = agent_qs.shape[:-1]
        s = floats(states.reshape(-1, self.state_dim))
        q = agent_qs.reshape(-1, 1, self.n_agents)
        w1 = self.hyper_w1(s).abs().view(-1, self.n_agents, self.embed)
        b1 = self.hyper_b1(s).view(-1, 1, self.embed)
        hidden = F.elu(torch.bmm(q, w1) + b1)
        w2 = self.hyper_w2(s).abs().view(-1, self.embed, 1)
        return (torch.bmm(hidden, w2).view(-1) + self.value(s).view(-1)).view(lead)


class CentralMixer(nn.Module):
    """MAC-PO's Q*: an unconstrained feed-forward net over [state, the agents' Q of their taken actions].

    WQMIX's central "QMIX-ff" mixer (ReLU layers of width ``hidden``). Here it reads the QMIX agents'
    chosen-action Q-values (detached, so its loss never moves the agents) instead of a central agent net.
    """

    def __init__(self, n_agents: int, state_dim: int, hidden: int = 256):
        super().__init__()
        self.n_agents, self.state_dim = n_agents, state_dim
        self.net = nn.Sequential(nn.Linear(state_dim + n_agents, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, agent_qs: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        lead = agent_qs.shape[:-1]
        x = torch.cat([floats(states.reshape(-1, self.state_dim)), agent_qs.reshape(-1, self.n_agents)], dim=1)
        return self.net(x).view(lead)


def mask_unavailable(q: torch.Tensor, avail: torch.Tensor, fill: float = UNAVAILABLE) -> torch.Tensor:
    """``q`` with unavailable actions set to ``fill``; a row with no available action (padding) is left as is."""
    usable = avail | ~avail.any(dim=-1, keepdim=True)
    return q.masked_fill(~usable, fill)
