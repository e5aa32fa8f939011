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

from mpirl.agents.networks import build_network


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


def apex_epsilon(index: int, actors: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X exploration of actor ``index`` of ``actors``: base ** (1 + alpha * i / (N - 1))."""
    if actors <= 1:
        return base
    return base ** (1.0 + alpha * index / (actors - 1))


def env_epsilons(actor_index: int, actors: int, envs_per_actor: int, base: float = 0.4,
                 alpha: float = 7.0) -> np.ndarray:
    """Ape-X epsilons for the ``envs_per_actor`` games of one actor.

    Ape-X gives each of its N single-game actors its own epsilon; with k games per
    actor rank every game plays that role: game j of actor i is Ape-X actor i*k + j
    of N*k, so the whole spread from ``base`` down to ``base ** (1 + alpha)`` is used.
    """
    k = envs_per_actor
    return np.array([apex_epsilon(actor_index * k + j, actors * k, base, alpha) for j in range(k)])


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16 matrix products natively (AMX / AVX-512 BF16 CPUs, GPUs)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    probes = [getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    return any(p() for p in probes if p is not None)


def pick_precision(name: str, device: torch.device) -> str:
    if name == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return name


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def to_tensors(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """Numpy views -> tensors on ``device`` (zero-copy on the CPU)."""
    return {k: torch.as_tensor(v, device=device) for k, v in batch.items()}


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


class DQNLearner:
    """The learner's networks, optimizer and one train step."""

    def __init__(self, obs_shape, n_actions: int, agent_cfg, device: torch.device, seed: int = 0):
        torch.manual_seed(seed)
        self.device = device
        self.online = build_network(obs_shape, n_actions, agent_cfg.hidden).to(device)
        self.target = build_network(obs_shape, n_actions, agent_cfg.hidden).to(device)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=agent_cfg.lr, eps=agent_cfg.adam_eps)
        self.grad_clip = agent_cfg.grad_clip
        self.target_update = agent_cfg.target_update
        self.steps = 0
        self.precision = pick_precision(getattr(agent_cfg, "precision", "fp32"), device)
        self.bf16 = self.precision == "bf16"
        self.n_params = sum(p.numel() for p in self.online.parameters())
        self.skip_reason = ""  # what was not finite in the last skipped batch

    def train_step(self, batch: dict[str, np.ndarray], weights: np.ndarray) -> tuple[float, np.ndarray]:
        """One gradient step on a batch with IS ``weights``; returns (loss, new |TD| as numpy).

        A batch whose loss or gradient is not finite is skipped: no step, no weight
        change, and ``None`` instead of the |TD| (the caller keeps the old priorities).
        """
        b = to_tensors(batch, self.device)
        w = torch.as_tensor(weights, device=self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            y = n_step_target(self.online, self.target, b).float()
            q = self.online(b["obs"]).gather(1, b["action"].view(-1, 1)).squeeze(1).float()
        loss = (w * F.smooth_l1_loss(q, y, reduction="none")).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.grad_clip)
        if not (torch.isfinite(loss) and torch.isfinite(norm)):
            self.skip_reason = self._what_was_not_finite(b, y, q, loss)
            self.optimizer.zero_grad(set_to_none=True)
            return float(loss.detach()), None  # skipped: the weights are untouched, no step counted
        self.optimizer.step()
        self.steps += 1
        if self.steps % self.target_update == 0:
            self.target.load_state_dict(self.online.state_dict())
        return float(loss.detach()), (y - q.detach()).abs().cpu().numpy()

    def _what_was_not_finite(self, b: dict, y: torch.Tensor, q: torch.Tensor, loss: torch.Tensor) -> str:
        """The first non-finite thing on the way from the batch to the gradient, in words."""
        for name in ("reward", "obs", "next_obs"):
            if b[name].is_floating_point() and not torch.isfinite(b[name]).all():
                return f"the batch's {name} (from the environment)"
        for name, p in self.online.named_parameters():
            if not torch.isfinite(p).all():
                return f"the online network's parameters ({name})"
        if not torch.isfinite(q).all():
            return "the online network's Q-values"
        if not torch.isfinite(y).all():
            return "the n-step targets (the target network's Q-values)"
        if not torch.isfinite(loss):
            return f"the loss ({float(loss.detach()):g})"
        for name, p in self.online.named_parameters():
            if p.grad is not None and not torch.isfinite(p.grad).all():
                return f"the gradient of {name} (loss {float(loss.detach()):g})"
        return "the gradient's norm"

    def flat_params(self) -> np.ndarray:
        """The online network's parameters as one float32 numpy vector (on the CPU)."""
        return torch.nn.utils.parameters_to_vector(self.online.parameters()).detach().cpu().numpy()


class ActingPolicy:
    """An actor's local copy of the network: epsilon-greedy actions and initial priorities."""

    def __init__(self, obs_shape, n_actions: int, agent_cfg):
        self.net = build_network(obs_shape, n_actions, agent_cfg.hidden)
        self.net.requires_grad_(False)
        self.n_actions = n_actions
        self.n_params = sum(p.numel() for p in self.net.parameters())

    def load_flat(self, params: np.ndarray) -> None:
        torch.nn.utils.vector_to_parameters(torch.from_numpy(params), self.net.parameters())

    @torch.no_grad()
    def act(self, obs: np.ndarray, epsilon, rng: np.random.Generator) -> np.ndarray:
        """Actions for a batch of observations ``(k, *obs_shape)``; ``epsilon``: one or one per row."""
        greedy = self.net(torch.as_tensor(obs)).argmax(dim=1).numpy()
        explore = rng.random(len(greedy)) < epsilon
        return np.where(explore, rng.integers(self.n_actions, size=len(greedy)), greedy)

    def priorities(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Initial priorities |TD| from the local network (Ape-X: computed by the actor)."""
        b = to_tensors(batch, torch.device("cpu"))
        return td_errors(self.net, self.net, b).numpy()
