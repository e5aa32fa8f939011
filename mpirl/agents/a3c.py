"""The gradient family's model: an actor-critic (:class:`~mpirl.agents.actor_critic.ActorCritic`, IMPALA's network)
that a worker plays and computes gradients with, and that whoever applies gradients steps with its optimizer.

A worker records a rollout of ``unroll`` steps of its ``E`` games (:class:`Rollout`, time-major ``[T, E]``), computes
advantages and returns with GAE (:func:`~mpirl.agents.policy_gradient.gae`: ``lambda = 1`` is A2C's n-step return)
and then, for each gradient the loss asks for (A2C: one over the whole rollout; PPO: ``epochs`` passes of
``minibatches``), the flat float32 gradient of its loss (:meth:`A3cModel.gradient`). Applying one
(:meth:`A3cModel.apply`) clips it to ``agent.grad_clip`` and steps the optimizer (Adam or RMSProp). No MPI here.

**Normalisation** (``agent.normalize_obs``, ``agent.normalize_reward``; :mod:`mpirl.agents.running_stats`) rides
the same vectors, so every exchange carries it without a message of its own: the flat parameters end with the
job's statistics (count, means, variances), and a gradient ends with the *moments* the worker counted since its
last gradient (its rollout's observations and discounted returns; zeros in a rollout's later gradients). Applying a
gradient folds its moments into the statistics (Chan's update) -- unscaled: ``scale`` turns a sum of gradients into
their mean, and the moments of several workers are already their union's -- and a gradient dropped for staleness
still gives its moments (:meth:`A3cModel.fold`). A worker normalises with the statistics it last loaded; the
rollout keeps the normalised observations and rewards it acted and learns on (SB3's ``VecNormalize`` alike).
"""

from __future__ import annotations

import numpy as np
import torch

from mpirl.agents.actor_critic import actor_critic, core_step
from mpirl.agents.distributions import actor_outputs
from mpirl.agents.sampling import log_prob, sample
from mpirl.agents.tensors import as_arrays, as_tensors, to_tensors
from mpirl.agents.flat_grads import clip_scale, flat_grad, flat_values, flat_norm, set_flat_grad
from mpirl.agents.optimizers import adam, rmsprop
from mpirl.agents.policy_gradient import PGLosses, a2c_losses, gae, ppo_losses
from mpirl.agents.running_stats import normalization
from mpirl.agents.schedules import Linear
from mpirl.envs.actions import ActionSpec, as_spec


class Rollout:
    """Preallocated ``[T, E]`` arrays of one rollout; ``steps`` of them filled (a preempted rollout has fewer)."""

    def __init__(self, T: int, E: int, obs_shape: tuple, obs_dtype, action: ActionSpec | int = 1,
                 state_size: int = 0):
        self.T, self.E = T, E
        spec = as_spec(action)
        self.obs = np.zeros((T, E, *obs_shape), obs_dtype)
        self.action = np.zeros((T, E, *spec.shape), spec.dtype)
        self.logp = np.zeros((T, E), np.float32)
        self.value = np.zeros((T, E), np.float32)
        self.reward = np.zeros((T, E), np.float32)
        self.terminated = np.zeros((T, E), np.bool_)
        self.truncated = np.zeros((T, E), np.bool_)
        self.final_value = np.zeros((T, E), np.float32)
        self.bootstrap = np.zeros(E, np.float32)
        self.steps = 0
        # A recurrent policy's: where an episode starts (the core's state zeroed before that step) and the core's
        # state before the rollout's first step, for the loss to unroll from.
        self.first = np.zeros((T, E), np.bool_) if state_size else None
        self.h0 = np.zeros((E, state_size), np.float32)
        self.c0 = np.zeros((E, state_size), np.float32)

    def fields(self) -> dict[str, np.ndarray]:
        n = self.steps
        out = {"obs": self.obs[:n], "action": self.action[:n], "logp": self.logp[:n], "value": self.value[:n],
               "reward": self.reward[:n], "terminated": self.terminated[:n], "truncated": self.truncated[:n],
               "final_value": self.final_value[:n], "bootstrap": self.bootstrap}
        if self.first is not None:
            out.update(first=self.first[:n], h0=self.h0, c0=self.c0)
        return out


class Prepared:
    """A rollout as flat ``[N, ...]`` tensors with its advantages and returns (N = steps x E); a recurrent policy's
    keeps them ``[T, E]`` (its minibatches are whole games: N = E) with where episodes start and the core's state
    before the first step."""

    def __init__(self, b: dict[str, torch.Tensor], gamma: float, lam: float):
        adv, ret = gae(b["reward"], b["value"], b["bootstrap"], b["terminated"], b["truncated"], b["final_value"],
                       gamma, lam)
        T, E = b["reward"].shape
        self.recurrent = "first" in b
        if self.recurrent:
            self.n = E
            self.obs, self.action, self.logp, self.advantages, self.returns = b["obs"], b["action"], b["logp"], adv, ret
            self.first, self.h0, self.c0 = b["first"], b["h0"], b["c0"]
            return
        self.n = T * E
        self.obs = b["obs"].reshape(T * E, *b["obs"].shape[2:])
        self.action = b["action"].reshape(T * E, *b["action"].shape[2:])
        self.logp = b["logp"].reshape(-1)
        self.advantages = adv.reshape(-1)
        self.returns = ret.reshape(-1)


class A3cModel:
    """The network, and (``optimizer=True``) the optimizer that applies gradients to it."""

    def __init__(self, obs_shape, action: ActionSpec | int, agent_cfg, a3c_cfg, device: torch.device, seed: int,
                 optimizer: bool, obs_shift: np.ndarray | None = None, schedules: dict[str, Linear] | None = None,
                 obs_dtype=None):
        torch.manual_seed(seed)  # every rank the same seed: the same initial parameters
        self.device, self.cfg, self.agent_cfg = device, a3c_cfg, agent_cfg
        self.spec = as_spec(action)
        self.net = actor_critic(obs_shape, self.spec, agent_cfg).to(device)
        self.params = list(self.net.parameters())
        self.norm = normalization(obs_shape, agent_cfg, obs_shift, obs_dtype)
        self.n_net = sum(p.numel() for p in self.params)
        self.n_params = self.n_net + self.norm.n_stats  # what travels: the network's, then the statistics
        self.optimizer: torch.optim.Optimizer | None = None
        if optimizer:
            c = a3c_cfg
            if c.optimizer == "rmsprop":
                self.optimizer = rmsprop(self.params, agent_cfg.lr, c.rmsprop_alpha, c.rmsprop_eps)
            else:
                self.optimizer = adam(self.params, agent_cfg.lr, agent_cfg.adam_eps)
        self.fault = ""
        self.schedules = schedules or {}  # "lr", "entropy_coef", "clip" -> their schedule (mpirl.agents.schedules)
        self.entropy_coef, self.clip = a3c_cfg.entropy_coef, a3c_cfg.clip
        self.recurrent = self.net.core is not None
        self.h = self.c = np.zeros((0, self.net.state_size), np.float32)  # each game's core state (recurrent)
        # the state the last act() started from, and where it was zeroed
        self.before: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None

    def at(self, progress: float) -> None:
        """The scheduled settings where the run is (``progress`` in ``agent.schedule_unit``): the optimizer's
        learning rate, the loss's entropy coefficient and PPO's clip."""
        s = self.schedules
        if not s:
            return
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = s["lr"](progress)
        self.entropy_coef, self.clip = s["entropy_coef"](progress), s["clip"](progress)

    # -- playing
    def observe(self, obs: np.ndarray) -> np.ndarray:
        """Observations to act on: counted for the statistics and normalised (as they are without
        ``agent.normalize_obs``)."""
        return self.norm.observe(obs)

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """Observations normalised, not counted (final observations of truncated episodes, the bootstrap's)."""
        return self.norm.normalize(obs)

    def rewards(self, reward: np.ndarray, ended: np.ndarray) -> np.ndarray:
        """Rewards as the loss takes them (``agent.normalize_reward``: scaled by the discounted return's spread)."""
        return self.norm.rewards(reward, ended)

    def restart(self) -> None:
        """The games were rebuilt: every game's running discounted return begins again (no episode goes on)."""
        self.norm.restart()

    def begin(self, ro: Rollout) -> None:
        """A rollout starts: a recurrent policy's core state is its first step's (zeros for games not seen yet)."""
        if self.recurrent:
            self._ensure(ro.E)
            ro.h0[:], ro.c0[:] = self.h, self.c

    def _ensure(self, k: int) -> None:
        if len(self.h) != k:
            self.h = np.zeros((k, self.net.state_size), np.float32)
            self.c = np.zeros((k, self.net.state_size), np.float32)

    def _step(self, obs: np.ndarray, starts: np.ndarray | None, state=None):
        """The recurrent network one step on ``obs`` from ``state`` (the games' current one), zeroed where
        ``starts``: ``(outputs, values, h, c)``."""
        h, c = state if state is not None else (self.h, self.c)
        return core_step(self.net, obs, h, c, starts, self.device)

    @torch.no_grad()
    def act(self, obs: np.ndarray, rng: np.random.Generator, starts: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sampled actions, their log-probabilities and the values of ``obs``; a recurrent policy carries each game's
        state to the next step, zeroed first for the games where ``starts`` says an episode begins."""
        if self.recurrent:
            self._ensure(len(obs))
            self.before = (self.h, self.c, starts)
            out, values, self.h, self.c = self._step(obs, starts)
        else:
            out, values = self.net(torch.as_tensor(obs, device=self.device))
        actions, logp = sample(self.spec, actor_outputs(self.spec, out), self._log_std(), rng)
        return actions, logp, values.float().cpu().numpy()

    def _log_std(self) -> np.ndarray | None:
        ls = self.net.log_std
        return None if ls is None else ls.detach().double().cpu().numpy()

    @torch.no_grad()
    def log_prob(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """The policy's log-probabilities of ``actions`` in ``obs`` (an action the games forced, such as FIRE after
        a lost life, in place of the sampled one)."""
        if self.recurrent:
            assert self.before is not None, "log_prob() of the actions act() just sampled"
            h, c, starts = self.before
            out = self._step(obs, starts, (h, c))[0]
        else:
            out, _ = self.net(torch.as_tensor(obs, device=self.device))
        return log_prob(self.spec, actor_outputs(self.spec, out), self._log_std(), actions)

    @torch.no_grad()
    def values(self, obs: np.ndarray, rows: np.ndarray | None = None, starts: np.ndarray | None = None) -> np.ndarray:
        """The values of ``obs``; a recurrent policy's from the current state of the games ``rows`` (a mask; all by
        default), zeroed where ``starts``, without moving it."""
        if self.recurrent:
            state = (self.h, self.c) if rows is None else (self.h[rows], self.c[rows])
            return self._step(obs, starts, state)[1].float().cpu().numpy()
        return self.net(torch.as_tensor(obs, device=self.device))[1].float().cpu().numpy()

    # -- gradients
    def prepare(self, rollout: Rollout) -> Prepared:
        return Prepared(to_tensors(rollout.fields(), self.device), self.agent_cfg.gamma, self.cfg.gae_lambda)

    def losses(self, p: Prepared, idx: np.ndarray | None) -> PGLosses:
        c = self.cfg
        sel = slice(None) if idx is None else torch.as_tensor(idx, device=self.device)
        if p.recurrent:  # whole games, unrolled from the state the rollout started with
            obs, action = p.obs[:, sel], p.action[:, sel]
            out, values, _, _ = self.net.unroll(obs, p.h0[sel], p.c0[sel], p.first[:, sel])
            n = out.shape[0] * out.shape[1]
            logp, entropy = self.net.log_prob_entropy(out.reshape(n, -1), action.reshape(n, *action.shape[2:]))
            ev = (logp, entropy, values.reshape(n))
            old, adv, ret = p.logp[:, sel].reshape(n), p.advantages[:, sel].reshape(n), p.returns[:, sel].reshape(n)
        else:
            ev, old, adv, ret = None, p.logp[sel], p.advantages[sel], p.returns[sel]
            obs, action = p.obs[sel], p.action[sel]
        if c.loss == "ppo":
            return ppo_losses(self.net, obs, action, old, adv, ret, self.clip, c.value_coef, self.entropy_coef,
                              c.normalize_advantages, evaluated=ev)
        return a2c_losses(self.net, obs, action, adv, ret, c.value_coef, self.entropy_coef, evaluated=ev)

    def gradient(self, p: Prepared, idx: np.ndarray | None, out: np.ndarray) -> dict[str, float] | None:
        """The loss's gradient on the samples ``idx`` (all: None) into ``out``; its statistics, or None (``out``
        not to be used) when the loss or the gradient is not finite."""
        losses = self.losses(p, idx)
        for q in self.params:
            q.grad = None
        losses.total.backward()
        flat_grad(self.params, out[:self.n_net])
        norm = flat_norm(out[:self.n_net])  # the vector that travels: one pass, not one per parameter
        loss = float(losses.total.detach())
        if not (np.isfinite(loss) and np.isfinite(norm)):
            self.fault = f"the loss was {loss:g} and the gradient's norm {norm:g}"
            return None
        self.norm.take_moments(out[self.n_net:])
        return {"loss": loss, "policy_loss": float(losses.policy.detach()),
                "value_loss": float(losses.value.detach()), "entropy": float(losses.entropy.detach()),
                "grad_norm": norm, "clip_fraction": float(losses.clip_fraction),
                "approx_kl": float(losses.approx_kl)}

    def apply(self, grad: np.ndarray, scale: float = 1.0) -> float:
        """Step the optimizer with the flat gradient ``scale`` x ``grad`` (clipped to ``agent.grad_clip``, as
        ``clip_grad_norm_`` clips, in the same pass as the copy into the parameters' gradients); its norm before
        clipping."""
        assert self.optimizer is not None, "a model without an optimizer applies no gradient"
        g = grad[:self.n_net]
        norm = scale * flat_norm(g)
        set_flat_grad(self.params, g, scale * clip_scale(norm, self.agent_cfg.grad_clip))
        self.optimizer.step()
        self.fold(grad)
        return norm

    def fold(self, grad: np.ndarray) -> None:
        """The moments a gradient (or the sum of several) carries, folded into the statistics; the network
        untouched (a gradient the server drops still tells what its worker saw)."""
        if self.norm.on:
            self.norm.fold(grad[self.n_net:])

    # -- parameters
    def load(self, flat: np.ndarray) -> None:
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(torch.as_tensor(flat[:self.n_net], device=self.device), self.params)
        if self.norm.on:
            self.norm.load_stats(flat[self.n_net:])

    def flat_params(self, out: np.ndarray | None = None) -> np.ndarray:
        """The parameters as one float32 vector: a new one, or written into ``out`` (and returned)."""
        if out is None:
            out = np.empty(self.n_params, np.float32)
        flat_values(self.params, out[:self.n_net])
        if self.norm.on:
            self.norm.stats_flat(out[self.n_net:])
        return out

    def state(self) -> dict:
        out = {"net": self.net.state_dict(), "normalization": as_tensors(self.norm.state())}
        if self.optimizer is not None:
            out["optimizer"] = self.optimizer.state_dict()
        return out

    def restore(self, st: dict) -> None:
        self.net.load_state_dict(st["net"])
        self.norm.restore(as_arrays(st.get("normalization", {})))
        if self.optimizer is not None and "optimizer" in st:
            self.optimizer.load_state_dict(st["optimizer"])

