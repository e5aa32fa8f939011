"""Dueling double DQN with n-step targets and prioritized-replay importance weights.

The transition spec below is what actors send, buffers store and the learner
trains on. ``reward`` is the n-step discounted return, ``discount`` the factor
gamma**m for the m rewards it sums, ``done`` cuts the bootstrap (termination,
not a time limit).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mpirl.agents.exploration import explore
from mpirl.agents.networks import NetworkCopy, build_network
from mpirl.agents.optimizers import Adam
from mpirl.agents.tensors import floats, pick_precision, to_tensors
from mpirl.agents.train_step import Fault, GradientPeers, not_finite


def transition_spec(obs_shape: tuple[int, ...], obs_dtype) -> dict:
    """Field name -> (per-record shape, dtype); observations keep their native dtype."""
    return {
        "obs": (tuple(obs_shape), np.dtype(obs_dtype)),
        "action": ((), np.dtype(np.int64)),
        "reward": ((), np.dtype(np.float32)),
        "next_obs": (tuple(obs_shape), np.dtype(obs_dtype)),
        "done": ((), np.dtype(np.bool_)),
        "discount": ((), np.dtype(np.float32)),
    }


@torch.no_grad()
def td_errors(online, target, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """|TD| of each transition with the double-DQN target; ``target`` may be ``online``."""
    q = online(b["obs"]).gather(1, b["action"].view(-1, 1)).squeeze(1)
    return (n_step_target(online, target, b) - q).abs()


@torch.no_grad()
def n_step_target(online, target, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """y = R + gamma^m * (1 - done) * Q_target(s', argmax_a Q_online(s', a))."""
    q_next_online = online(b["next_obs"])
    q_next_target = q_next_online if target is online else target(b["next_obs"])  # actors: one net
    next_q = q_next_target.gather(1, q_next_online.argmax(dim=1, keepdim=True)).squeeze(1)
    return b["reward"] + b["discount"] * (~b["done"]).float() * next_q


# The settings that feed each kind of non-finite batch (see DQNLearner.diagnose), named in the divergence message.
FEEDS = {"batch": ("env.id", "agent.reward_clip"),
         "weights": ("replay.alpha", "replay.beta", "replay.priority_eps"),
         "parameters": ("agent.lr", "agent.grad_clip", "agent.adam_eps"),
         "q": ("agent.lr", "agent.grad_clip", "agent.adam_eps"),
         "targets": ("agent.reward_clip", "agent.lr", "agent.grad_clip", "agent.target_update"),
         "loss": ("agent.reward_clip", "env.id", "agent.lr", "agent.grad_clip"),
         "gradient": ("agent.lr", "agent.grad_clip", "agent.adam_eps", "agent.reward_clip"),
         "peer": ()}  # that learner's message names the settings


def divergence(fault: Fault, settings: dict, in_a_row: int, steps: int, skipped: int) -> str:
    """Why the learner gives up: what was not finite in the last skipped batch and the settings that feed it."""
    feeds = ", ".join(f"{k}={settings[k]:g}" if isinstance(settings[k], float) else f"{k}={settings[k]}"
                      for k in FEEDS[fault.kind])
    what = "cannot train" if fault.kind in ("batch", "peer") else "has diverged"  # "batch": what the env gave
    tail = f"; the settings that feed it: {feeds}" if feeds else ""
    return (f"the learner {what}: {in_a_row} batches in a row were not finite after train step {steps} "
            f"({skipped} skipped in all); in the last, {fault.detail}{tail}")


class DQNLearner:
    """The learner's networks, optimizer and one train step."""

    def __init__(self, obs_shape, n_actions: int, agent_cfg, device: torch.device, seed: int = 0):
        torch.manual_seed(seed)
        self.device = device
        self.online = build_network(obs_shape, n_actions, agent_cfg.hidden, agent_cfg.network).to(device)
        self.target = build_network(obs_shape, n_actions, agent_cfg.hidden, agent_cfg.network).to(device)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        self.optimizer = Adam(self.online.parameters(), lr=agent_cfg.lr, eps=agent_cfg.adam_eps)  # torch's Adam
        self.grad_clip = agent_cfg.grad_clip
        self.target_update = agent_cfg.target_update
        self.steps = 0
        self.precision = pick_precision(getattr(agent_cfg, "precision", "fp32"), device)
        self.bf16 = self.precision == "bf16"
        self.n_params = sum(p.numel() for p in self.online.parameters())
        self.fault: Fault | None = None  # why the last skipped batch was skipped

    def _forward(self, b: dict[str, torch.Tensor], w: torch.Tensor, total: int = 0):
        """Targets, Q-values and the loss: the weighted Huber loss's mean over the batch, or with ``total`` (the
        rows of the whole batch several learners share) this part's sum over ``total``, so the learners' losses
        and gradients add up to the whole batch's."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            y = floats(n_step_target(self.online, self.target, b))
            q = floats(self.online(b["obs"]).gather(1, b["action"].view(-1, 1)).squeeze(1))
        per_sample = w * F.smooth_l1_loss(q, y, reduction="none")
        return y, q, (per_sample.sum() / total if total else per_sample.mean())

    def train_step(self, batch: dict[str, np.ndarray], weights: np.ndarray,
                   peers: GradientPeers | None = None) -> tuple[float, np.ndarray]:
        """One gradient step on a batch with IS ``weights``; returns (loss, new |TD| as numpy).

        With ``peers`` (data-parallel learners) the batch is this learner's part of one batch of ``peers.total``
        rows: the loss is its sum over that total, and the gradients and losses of every part are summed before
        clipping, so every learner takes the step one learner would take on the whole batch; the |TD| returned
        are this part's.

        A batch whose loss or gradient is not finite is skipped: no step, no weight
        change, and ``None`` instead of the |TD| (the caller keeps the old priorities);
        ``self.fault`` then says what was not finite.
        """
        b = to_tensors(batch, self.device)
        w = torch.as_tensor(weights, device=self.device)
        y, q, loss = self._forward(b, w, peers.total if peers else 0)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if peers is not None:  # the learners' gradients and losses summed: the whole batch's, on every learner
            loss, = peers.sum_grads(self.online.parameters(), loss)
        norm = torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.grad_clip)
        if not (torch.isfinite(loss) and torch.isfinite(norm)):  # with peers: the same verdict on every learner
            whose = peers.others_part() if peers is not None else ""
            self.fault = Fault("peer", whose) if whose else self.diagnose(b, w, y, q, loss)
            self.optimizer.zero_grad(set_to_none=True)
            return float(loss.detach()), None  # skipped: the weights are untouched, no step counted
        self.optimizer.step()
        self.steps += 1
        if self.steps % self.target_update == 0:
            self.target.load_state_dict(self.online.state_dict())
        return float(loss.detach()), (y - q.detach()).abs().cpu().numpy()

    def diagnose(self, b: dict[str, torch.Tensor], w: torch.Tensor, y: torch.Tensor, q: torch.Tensor,
                 loss: torch.Tensor) -> Fault:
        """What was not finite in a skipped batch, walking from its inputs to the gradient.

        Only on a skipped batch: the gradient is computed again, per parameter and before
        clipping (clipping by a non-finite norm has made every gradient NaN or 0).
        """
        n = len(w)
        for name in ("reward", "discount", "obs", "next_obs"):
            if b[name].is_floating_point() and not_finite(b[name]):
                return Fault("batch", f"{not_finite(b[name])} of the batch's {n} {name} values were not finite")
        if not_finite(w):
            return Fault("weights", f"{not_finite(w)} of the batch's {n} importance weights were not finite")
        for net in ("online", "target"):
            bad = [k for k, p in getattr(self, net).named_parameters() if not_finite(p.detach())]
            if bad:
                return Fault("parameters", f"the {net} network's parameters were not finite ({', '.join(bad)})")
        if not_finite(q):
            return Fault("q", f"{not_finite(q)} of the online network's {n} Q-values were not finite (its parameters "
                              f"are finite, up to {self._largest_parameter()})")
        if not_finite(y):
            return Fault("targets", f"{not_finite(y)} of the {n} n-step targets were not finite (n-step rewards up to "
                                    f"{float(b['reward'].abs().max()):g}, the networks' parameters finite)")
        if not torch.isfinite(loss):
            return Fault("loss", f"the loss was {float(loss.detach()):g} though its inputs were finite (|TD| up to "
                                 f"{float((y - q.detach()).abs().max()):g}, n-step rewards up to "
                                 f"{float(b['reward'].abs().max()):g})")
        self.optimizer.zero_grad(set_to_none=True)
        self._forward(b, w)[2].backward()
        norms = {k: float(torch.linalg.vector_norm(p.grad)) for k, p in self.online.named_parameters()
                 if p.grad is not None}
        bad = [f"{k} ({v:g})" for k, v in norms.items() if not np.isfinite(v)]
        if bad:
            return Fault("gradient", f"the gradient norm of {', '.join(bad)} was not finite (loss {float(loss.detach()):g})")
        top = max(norms, key=norms.get)
        return Fault("gradient", f"the gradient's total norm overflowed (per parameter finite, largest "
                                 f"{norms[top]:g} in {top}; loss {float(loss.detach()):g})")

    def _largest_parameter(self) -> str:
        name, p = max(self.online.named_parameters(), key=lambda kv: float(kv[1].detach().abs().max()))
        return f"{float(p.detach().abs().max()):g} in {name}"

    def flat_params(self) -> np.ndarray:
        """The online network's parameters as one float32 numpy vector (on the CPU)."""
        return torch.nn.utils.parameters_to_vector(self.online.parameters()).detach().cpu().numpy()


class ActingPolicy(NetworkCopy):
    """An actor's local copy of the network in torch: epsilon-greedy actions and initial priorities (the
    convolutional networks; the MLP's copy is numpy's, :class:`mpirl.agents.acting.MLPActing`)."""

    def __init__(self, obs_shape, n_actions: int, agent_cfg):
        super().__init__(build_network(obs_shape, n_actions, agent_cfg.hidden, agent_cfg.network))
        self.n_actions = n_actions

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """The best action of each observation in a batch ``(k, *obs_shape)``."""
        return self.net(torch.as_tensor(obs)).argmax(dim=1).numpy()

    def act(self, obs: np.ndarray, epsilon, rng: np.random.Generator) -> np.ndarray:
        """Actions for a batch of observations ``(k, *obs_shape)``; ``epsilon``: one or one per row."""
        return explore(self.greedy(obs), epsilon, rng, self.n_actions)

    def priorities(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Initial priorities |TD| from the local network (Ape-X: computed by the actor)."""
        b = to_tensors(batch, torch.device("cpu"))
        return td_errors(self.net, self.net, b).numpy()
