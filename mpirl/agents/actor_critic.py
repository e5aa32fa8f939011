"""Actor-critic networks and the IMPALA learner's train step (V-trace, :mod:`mpirl.agents.vtrace`).

The torso is the Q-networks' (:mod:`mpirl.agents.networks`: the MLP for vectors, MinAtar's convolution for small
images, Nature's for 84x84 stacks, chosen from the observation), followed by one ``hidden[-1]``-wide layer shared by
a policy head and a value head. The policy head's outputs and the action distribution they define depend on the
action space (:mod:`mpirl.agents.distributions`): logits of one categorical per discrete dimension, or a diagonal
Gaussian's means with a learned state-independent log standard deviation (``agent.log_std_init`` at the start).
``agent.shared_torso = false`` gives the value its own torso and layer of the same widths (SB3's and CleanRL's
networks for MuJoCo); ``agent.activation = "tanh"`` puts tanh between an MLP's layers (convolutions keep ReLU).

A trajectory record (:func:`trajectory_spec`) holds ``unroll`` steps of one game: the ``unroll + 1`` observations
(the last one bootstraps), the actions taken (as the :class:`~mpirl.envs.actions.ActionSpec` stores one: an int64,
int64 per dimension, or the unclipped float32 sample), the rewards, the behaviour policy's log-probability of each
action,
terminated and truncated apart, the behaviour policy's value of the final observation where a step was truncated
(a time limit; what Sample Factory bootstraps with too) and the parameter version the actions were chosen with.
A recurrent policy's record adds where episodes start (``first``, at each of the ``unroll + 1`` observations: the
core's state is zeroed before that step) and the core's state before the first step (``h0``, ``c0``), what the
learner unrolls from (as IMPALA and R2D2 store it).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from mpirl.agents.distributions import actor_outputs, log_prob_entropy
from mpirl.agents.schedules import Linear
from mpirl.agents.running_stats import normalization
from mpirl.agents.tensors import as_arrays, as_tensors, to_tensors
from mpirl.agents.network_choice import network_for
from mpirl.agents.networks import NetworkCopy, build_network, image_floats, nature_floats
from mpirl.agents.optimizers import adam, rmsprop
from mpirl.agents.vtrace import vtrace
from mpirl.envs.actions import ActionSpec, as_spec


def trajectory_spec(obs_shape: tuple[int, ...], obs_dtype, unroll: int, action: ActionSpec | int = 1,
                    returns: bool = False, state_size: int = 0) -> dict:
    """Field name -> (per-record shape, dtype) of one trajectory of ``unroll`` steps (actions of ``action``:
    one discrete action by default). ``returns``: each step's discounted return so far in its episode too (``ret``,
    what the learner's reward normalisation counts). ``state_size``: a recurrent core's width (0: none)."""
    T, act = int(unroll), as_spec(action)
    spec = {
        "obs": ((T + 1, *obs_shape), np.dtype(obs_dtype)),
        "action": ((T, *act.shape), act.dtype),
        "reward": ((T,), np.dtype(np.float32)),
        "logp": ((T,), np.dtype(np.float32)),
        "terminated": ((T,), np.dtype(np.bool_)),
        "truncated": ((T,), np.dtype(np.bool_)),
        "final_value": ((T,), np.dtype(np.float32)),
        "version": ((), np.dtype(np.int64)),
    }
    if returns:
        spec["ret"] = ((T,), np.dtype(np.float32))
    if state_size:
        spec["first"] = ((T + 1,), np.dtype(np.bool_))
        spec["h0"] = ((int(state_size),), np.dtype(np.float32))
        spec["c0"] = ((int(state_size),), np.dtype(np.float32))
    return spec


def _body(obs_shape: tuple, n_outputs: int, hidden: list[int], choice: str, activation: str) -> nn.Sequential:
    """The Q-network's torso for ``obs_shape`` and one ``hidden[-1]``-wide layer after it."""
    q = build_network(obs_shape, n_outputs, hidden, choice)  # its torso; its dueling head is not used
    torso = q.torso
    if activation == "tanh" and network_for(tuple(obs_shape), choice) == "mlp":
        torso = nn.Sequential(*(nn.Tanh() if isinstance(m, nn.ReLU) else m for m in torso))
    act = nn.Tanh() if activation == "tanh" and network_for(tuple(obs_shape), choice) == "mlp" else nn.ReLU()
    return nn.Sequential(torso, nn.Linear(q.head.value[0].in_features, hidden[-1]), act)


class ActorCritic(nn.Module):
    """Torso -> a ``hidden[-1]`` layer -> the policy head's outputs and (from the same layer, or with
    ``shared_torso = False`` from a network of its own) a value."""

    def __init__(self, obs_shape: tuple[int, ...], action: ActionSpec | int, hidden: list[int], choice: str = "auto",
                 *, activation: str = "relu", shared_torso: bool = True, log_std_init: float = 0.0,
                 recurrent: bool = False):
        super().__init__()
        self.spec = spec = as_spec(action)
        self.kind = network_for(tuple(obs_shape), choice)
        body = _body(obs_shape, spec.n_outputs, hidden, choice, activation)
        self.torso, self.shared = body[0], nn.Sequential(*body[1:])
        self.policy = nn.Linear(hidden[-1], spec.n_outputs)
        self.value = nn.Linear(hidden[-1], 1)
        self.critic = None if shared_torso else _body(obs_shape, spec.n_outputs, hidden, choice, activation)
        self.log_std = nn.Parameter(torch.full((spec.size,), float(log_std_init))) if spec.continuous else None
        # A recurrent policy: an LSTM core of hidden[-1] units after the shared layer, read by both heads.
        self.core = nn.LSTMCell(hidden[-1], hidden[-1]) if recurrent else None
        self.state_size = hidden[-1] if recurrent else 0

    def _features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = (obs.flatten(1) if self.kind == "mlp" else nature_floats(obs) if self.kind == "nature"
             else image_floats(obs))
        x = x.to(self.value.weight.dtype)
        return x, self.shared(self.torso(x))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(policy head outputs [N, n_outputs], V(x) [N])`` of a feed-forward network."""
        assert self.core is None, "a recurrent network unrolls (ActorCritic.unroll)"
        x, h = self._features(obs)
        return self.policy(h), self.value(h if self.critic is None else self.critic(x)).squeeze(-1)

    def unroll(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor, first: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A recurrent network over ``T`` steps of ``B`` games: ``obs`` [T, B, ...], the core's state before the
        first step ``h``, ``c`` [B, H], ``first`` [T, B] (True where an episode starts at that step: the state is
        zeroed before it). Returns the head's outputs [T, B, n_outputs], the values [T, B] and the state after."""
        T, B = obs.shape[:2]
        _, x = self._features(obs.reshape(T * B, *obs.shape[2:]))
        x = x.view(T, B, -1)
        keep = (~first.bool()).to(x.dtype).unsqueeze(-1)
        h, c = h.to(x.dtype), c.to(x.dtype)
        outs = []
        for t in range(T):
            h, c = self.core(x[t], (h * keep[t], c * keep[t]))
            outs.append(h)
        y = torch.stack(outs)
        return self.policy(y), self.value(y).squeeze(-1), h, c

    def log_prob_entropy(self, out: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log pi(a|x) [N], entropy of pi(.|x) [N])`` of the outputs ``out`` [N, n_outputs] and ``actions``."""
        return log_prob_entropy(self.spec, out, self.log_std, actions)


def core_step(net: ActorCritic, obs: np.ndarray, h: np.ndarray, c: np.ndarray, starts: np.ndarray | None,
              device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """A recurrent ``net`` one step on ``obs`` [k, ...] from the core's state ``h``, ``c`` [k, H] (numpy), zeroed
    first where ``starts`` (None: nowhere): the head's outputs [k, n_outputs], the values [k] and the state after
    (float32 numpy). What an actor, a worker or a gradient worker does each step."""
    first = np.zeros(len(obs), bool) if starts is None else np.asarray(starts, bool)
    out, values, h2, c2 = net.unroll(torch.as_tensor(obs, device=device)[None], torch.as_tensor(h, device=device),
                                     torch.as_tensor(c, device=device), torch.as_tensor(first, device=device)[None])
    return out[0], values[0], h2.float().cpu().numpy(), c2.float().cpu().numpy()


def orthogonal_init(net: ActorCritic) -> ActorCritic:
    """``agent.weight_init = "orthogonal"``, the actor-critic references' start (OpenAI Baselines, CleanRL, SB3,
    Sample Factory): every convolution and linear layer of the torso, the shared layers and a critic of its own
    orthogonal with gain sqrt(2), the policy head with 0.01 (a near-uniform first policy, or a Gaussian's means near
    0), the value head with 1, an LSTM core's weights with 1; every bias 0. ``net`` itself, changed in place."""
    heads = {id(net.policy): 0.01, id(net.value): 1.0}
    for module in net.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.orthogonal_(module.weight, heads.get(id(module), math.sqrt(2)))
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LSTMCell):
            for weight in (module.weight_ih, module.weight_hh):
                nn.init.orthogonal_(weight, 1.0)
            nn.init.zeros_(module.bias_ih)
            nn.init.zeros_(module.bias_hh)
    return net


def actor_critic(obs_shape: tuple[int, ...], action: ActionSpec | int, agent_cfg) -> ActorCritic:
    """The network ``[agent]`` describes."""
    a = agent_cfg
    net = ActorCritic(obs_shape, action, a.hidden, a.network, activation=a.activation, shared_torso=a.shared_torso,
                      log_std_init=a.log_std_init, recurrent=a.recurrent == "lstm")
    return orthogonal_init(net) if a.weight_init == "orthogonal" else net


class ActorCriticPolicy(NetworkCopy):
    """An actor's copy of the network: the head's outputs as the actors sample from them
    (:func:`~mpirl.agents.distributions.actor_outputs`; with ``log_std`` for a Gaussian) and values of final
    observations, both of raw observations normalised with the job's statistics where ``[agent]`` asks (they come
    after the network's parameters in the flat vector)."""

    def __init__(self, obs_shape, action: ActionSpec | int, agent_cfg, obs_dtype=None):
        super().__init__(actor_critic(obs_shape, action, agent_cfg))
        self.spec = as_spec(action)
        self.norm = normalization(obs_shape, agent_cfg, obs_dtype=obs_dtype)
        self.n_net = self.n_params
        self.n_params += self.norm.n_stats
        self.log_std: np.ndarray | None = None
        self._read_log_std()

    def _read_log_std(self) -> None:
        if self.net.log_std is not None:
            self.log_std = self.net.log_std.detach().double().cpu().numpy().copy()

    def load_flat(self, params) -> None:
        super().load_flat(params[:self.n_net])
        if self.norm.on:
            self.norm.load_stats(params[self.n_net:])
        self._read_log_std()

    @property
    def state_size(self) -> int:
        """The recurrent core's width (0: a feed-forward policy)."""
        return self.net.state_size

    @torch.no_grad()
    def outputs(self, obs: np.ndarray) -> np.ndarray:
        """float64 ``(k, n_outputs)``: per observation, each categorical's log-probabilities or the means."""
        out, _ = self.net(torch.as_tensor(self.norm.normalize(obs)))
        return actor_outputs(self.spec, out)

    @torch.no_grad()
    def step(self, obs: np.ndarray, h: np.ndarray, c: np.ndarray, starts: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A recurrent policy one step: :meth:`outputs` of ``obs`` from the core's state ``h``, ``c`` [k, H], zeroed
        first where ``starts``; and the state after."""
        out, _, h, c = core_step(self.net, self.norm.normalize(obs), h, c, starts)
        return actor_outputs(self.spec, out), h, c

    @torch.no_grad()
    def values(self, obs: np.ndarray, h: np.ndarray | None = None, c: np.ndarray | None = None) -> np.ndarray:
        """V of ``obs``; a recurrent policy's from the core's state ``h``, ``c`` (not moved)."""
        if self.net.core is not None:
            assert h is not None and c is not None, "a recurrent policy's value needs the core's state"
            return core_step(self.net, self.norm.normalize(obs), h, c, None)[1].numpy().astype(np.float32)
        return self.net(torch.as_tensor(self.norm.normalize(obs)))[1].numpy().astype(np.float32)


class Losses(NamedTuple):
    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    rho_clipped: torch.Tensor
    advantage: torch.Tensor  # mean |A| of the batch


def impala_losses(net: nn.Module, b: dict[str, torch.Tensor], gamma: float, rho_bar: float, c_bar: float, lam: float,
                  value_coef: float, entropy_coef: float) -> Losses:
    """The IMPALA loss of a batch of trajectories (tensors ``[B, ...]`` as :func:`trajectory_spec`): the policy
    gradient with V-trace advantages, ``value_coef`` x half the squared error to the V-trace targets, minus
    ``entropy_coef`` x the policy's entropy; means over the batch's steps. A recurrent network unrolls each
    trajectory from the core's state it stored (``h0``, ``c0``), zeroed where ``first`` says an episode starts."""
    obs = b["obs"]
    B, T1 = obs.shape[:2]
    if net.core is not None:
        out, values, _, _ = net.unroll(obs.transpose(0, 1), b["h0"], b["c0"], b["first"].transpose(0, 1))
        out, values = out.transpose(0, 1)[:, :-1], values.transpose(0, 1)
    else:
        out, values = net(obs.reshape(B * T1, *obs.shape[2:]))
        out, values = out.view(B, T1, -1)[:, :-1], values.view(B, T1)
    T = T1 - 1
    logp, ent = net.log_prob_entropy(out.reshape(B * T, -1), b["action"].reshape(B * T, *b["action"].shape[2:]))
    logp, ent = logp.view(B, T), ent.view(B, T)
    targets = vtrace(b["logp"], logp.detach(), b["reward"], values[:, :-1].detach(), values[:, -1].detach(),
                     b["terminated"], b["truncated"], b["final_value"], gamma, rho_bar, c_bar, lam)
    policy = -(targets.advantages * logp).mean()
    value = 0.5 * (targets.vs - values[:, :-1]).pow(2).mean()
    entropy = ent.mean()
    total = policy + value_coef * value - entropy_coef * entropy
    return Losses(total, policy, value, entropy, targets.rho_clipped, targets.advantages.abs().mean())


class ImpalaLearner:
    """The learner's network, optimizer (Adam or RMSProp) and one train step on a batch of trajectories."""

    def __init__(self, obs_shape, action: ActionSpec | int, agent_cfg, impala_cfg, device: torch.device,
                 seed: int = 0, schedules: dict[str, Linear] | None = None, obs_shift: np.ndarray | None = None,
                 obs_dtype=None):
        torch.manual_seed(seed)
        self.device = device
        self.net = actor_critic(obs_shape, action, agent_cfg).to(device)
        c = self.cfg = impala_cfg
        self.gamma, self.grad_clip = agent_cfg.gamma, agent_cfg.grad_clip
        if c.optimizer == "rmsprop":  # IMPALA's: RMSProp with a large epsilon
            self.optimizer: torch.optim.Optimizer = rmsprop(self.net.parameters(), agent_cfg.lr, c.rmsprop_alpha,
                                                            c.rmsprop_eps)
        else:
            self.optimizer = adam(self.net.parameters(), agent_cfg.lr, agent_cfg.adam_eps)
        self.steps = 0
        self.norm = normalization(obs_shape, agent_cfg, obs_shift, obs_dtype)  # the job's statistics, counted here
        self.n_net = sum(p.numel() for p in self.net.parameters())
        self.n_params = self.n_net + self.norm.n_stats  # what the actors load: the network's, then the statistics
        self.fault = ""  # what was not finite in the last skipped batch
        self.schedules = schedules or {}  # "lr", "entropy_coef" -> their schedule (mpirl.agents.schedules)
        self.entropy_coef = impala_cfg.entropy_coef

    def at(self, progress: float) -> None:
        """The scheduled learning rate and entropy coefficient where the run is (in ``agent.schedule_unit``)."""
        if self.schedules:
            for group in self.optimizer.param_groups:
                group["lr"] = self.schedules["lr"](progress)
            self.entropy_coef = self.schedules["entropy_coef"](progress)

    def losses(self, b: dict[str, torch.Tensor]) -> Losses:
        c = self.cfg
        return impala_losses(self.net, b, self.gamma, c.rho_bar, c.c_bar, c.lam, c.value_coef, self.entropy_coef)

    def train_step(self, batch: dict[str, np.ndarray]) -> dict[str, float] | None:
        """One gradient step; the step's statistics, or None (no step) when the loss or gradient is not finite."""
        b = to_tensors(self.normalized(batch), self.device)
        out = self.losses(b)
        self.optimizer.zero_grad(set_to_none=True)
        out.total.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.grad_clip)
        if not (torch.isfinite(out.total) and torch.isfinite(norm)):
            self.fault = (f"the loss was {float(out.total.detach()):g} and the gradient's norm {float(norm):g} "
                          f"(rewards up to {float(b['reward'].abs().max()):g})")
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.optimizer.step()
        self.steps += 1
        return {"loss": float(out.total.detach()), "policy_loss": float(out.policy.detach()),
                "value_loss": float(out.value.detach()), "entropy": float(out.entropy.detach()),
                "rho_clipped": float(out.rho_clipped), "advantage": float(out.advantage.detach()),
                "grad_norm": float(norm)}

    def normalized(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """With ``agent.normalize_obs`` / ``normalize_reward``: the batch's observations (each step's once) and
        discounted returns counted into the job's statistics, then its observations normalised and its rewards
        scaled with them. The actors acted on observations normalised with the statistics they had loaded: the
        difference is part of the policy lag that V-trace corrects."""
        n = self.norm
        if not n.on:
            return batch
        obs = batch["obs"]
        x = n.scaled(obs) if n.obs is not None else None  # one pass over the pixels for the count and the inputs
        n.count(obs=None if x is None else x[:, :-1], returns=batch.get("ret"), scaled=True)
        n.fold_counted()
        b = dict(batch)
        if x is not None:
            b["obs"] = n.normalize(x.reshape(-1, *obs.shape[2:]), scaled=True).reshape(obs.shape)
        if n.ret is not None:
            b["reward"] = n.scale(batch["reward"])
        return b

    def flat_params(self) -> np.ndarray:
        out = np.empty(self.n_params, np.float32)
        out[:self.n_net] = torch.nn.utils.parameters_to_vector(self.net.parameters()).detach().cpu().numpy()
        if self.norm.on:
            self.norm.stats_flat(out[self.n_net:])
        return out

    def state(self) -> dict:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "agent_steps": self.steps,
                "normalization": as_tensors(self.norm.state())}

    def restore(self, st: dict) -> None:
        self.net.load_state_dict(st["net"])
        self.norm.restore(as_arrays(st.get("normalization", {})))
        self.optimizer.load_state_dict(st["optimizer"])
        self.steps = int(st["agent_steps"])
