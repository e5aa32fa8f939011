"""The IMPALA and PPO steps ``mpirl bench gpu`` times: ours as the learner takes it, from the batch as numpy, and
beside it the bare PyTorch step, each family's loss written out by hand as a user would, on tensors already on the
device, with ``torch.optim.Adam``; the parts that need no gradient (V-trace, GAE) without autograd.
``tests/test_bench_gpu.py`` holds each bare loss equal to the learner's own on the same batch."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

OBS, ACTIONS, HIDDEN = (4, 84, 84), 4, [512]  # the Nature CNN on Atari stacks, Breakout's actions


def optimize(net, opt, loss: torch.Tensor, grad_clip: float) -> None:
    """One bare optimizer step on ``loss``: gradients, their global norm clipped, Adam."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), grad_clip)
    opt.step()


def _categorical(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp_all = F.log_softmax(logits.float(), dim=-1)
    return logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def bare_impala_loss(net, b: dict, gamma: float, rho_bar: float, c_bar: float, value_coef: float,
                     entropy_coef: float, bf16: bool = False) -> torch.Tensor:
    """IMPALA's loss written out (no truncated steps: the batch has none): one pass over every observation with
    autograd, V-trace without it, the policy gradient, half the squared error to the targets and the entropy."""
    obs = b["obs"]
    B, T1 = obs.shape[:2]
    with torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits, values = net(obs.reshape(B * T1, *obs.shape[2:]))
    logits, values = logits.float().view(B, T1, -1)[:, :-1], values.float().view(B, T1)
    logp, entropy = _categorical(logits, b["action"])
    with torch.no_grad():
        v, boot = values[:, :-1], values[:, -1]
        ratio = torch.exp(logp - b["logp"])
        rho, c = ratio.clamp(max=rho_bar), ratio.clamp(max=c_bar)
        disc = gamma * (~b["terminated"]).float()
        deltas = rho * (b["reward"] + disc * torch.cat([v[:, 1:], boot[:, None]], 1) - v)
        acc, corr = torch.zeros_like(boot), torch.empty_like(v)
        for t in range(T1 - 2, -1, -1):
            acc = deltas[:, t] + disc[:, t] * c[:, t] * acc
            corr[:, t] = acc
        vs = v + corr
        adv = rho * (b["reward"] + disc * torch.cat([vs[:, 1:], boot[:, None]], 1) - v)
    policy = -(adv * logp).mean()
    value = 0.5 * (vs - values[:, :-1]).pow(2).mean()
    return policy + value_coef * value - entropy_coef * entropy.mean()


def bare_gae(reward, value, bootstrap, terminated, gamma: float, lam: float):
    """GAE written out, ``[T, E]`` (no truncated steps), without autograd: ``(advantages, returns)``."""
    with torch.no_grad():
        keep = (~terminated).float()
        deltas = reward + gamma * keep * torch.cat([value[1:], bootstrap[None]]) - value
        adv, acc = torch.empty_like(value), torch.zeros_like(bootstrap)
        for t in range(value.shape[0] - 1, -1, -1):
            acc = deltas[t] + gamma * lam * keep[t] * acc
            adv[t] = acc
        return adv, adv + value


def bare_ppo_loss(net, obs, action, old_logp, adv, ret, clip: float, value_coef: float, entropy_coef: float,
                  bf16: bool = False) -> torch.Tensor:
    """PPO's clipped surrogate written out, advantages normalised over the minibatch, no value clipping."""
    with torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits, values = net(obs)
    logp, entropy = _categorical(logits, action)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = torch.exp(logp - old_logp)
    policy = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
    value = 0.5 * (ret - values.float()).pow(2).mean()
    return policy + value_coef * value - entropy_coef * entropy.mean()


# -- IMPALA

def impala_batch(B: int, T: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``B`` trajectories of ``T`` steps as a queue serves them (:func:`~mpirl.agents.actor_critic.trajectory_spec`):
    random frames and actions, behaviour log-probabilities near the uniform policy's, a few terminations, no
    truncation."""
    rng = np.random.default_rng(seed)
    return {"obs": rng.integers(0, 256, (B, T + 1, *OBS), dtype=np.uint8),
            "action": rng.integers(0, ACTIONS, (B, T)).astype(np.int64),
            "reward": (rng.random((B, T)) < 0.1).astype(np.float32),
            "logp": (math.log(1 / ACTIONS) + 0.1 * rng.standard_normal((B, T))).astype(np.float32),
            "terminated": rng.random((B, T)) < 0.02, "truncated": np.zeros((B, T), bool),
            "final_value": np.zeros((B, T), np.float32), "version": np.zeros(B, np.int64)}


def _impala_cfg(device: torch.device):
    """``jobs/impala_breakout.toml``'s learner: the Nature CNN, Adam, gamma 0.99, gradient norm 40 (without the job
    file's normalisations, which the learner does in numpy before the step: the step is what is compared here)."""
    from mpirl.config import JobConfig
    cfg = JobConfig()
    a = cfg.agent
    a.algorithm, a.hidden, a.network, a.device = "impala", list(HIDDEN), "nature", str(device)
    a.gamma, a.lr, a.grad_clip, a.reward_clip = 0.99, 6e-4, 40.0, 1.0
    a.normalize_obs = a.normalize_reward = False
    cfg.impala.test_episodes = 0
    cfg.run.seed, cfg.run.env_steps = 1, 50_000_000
    return cfg


def impala_learner(device: torch.device, B: int):
    """The IMPALA learner's algorithm without MPI: what it reads of a role's context."""
    from mpirl.actor_learner.counters import Counters
    from mpirl.algos.impala.learner import ImpalaTraining
    cfg = _impala_cfg(device)
    cfg.replay.batch_size = B
    from mpirl.agents.policy_checks import Spaces
    from mpirl.envs.actions import discrete
    spaces = Spaces(OBS, np.dtype(np.uint8), discrete(ACTIONS))  # what the roles carry: a typed tuple, not a namespace
    ctx = SimpleNamespace(cfg=cfg, spaces=spaces, seed=lambda: 1)
    return ImpalaTraining(ctx, np.random.default_rng(0), Counters(1, cfg.run.return_window))


def impala_steps(device: torch.device, B: int, T: int):
    """``(ours, bare fp32, bare bf16, training)``: the learner's train step on the batch as numpy, and the bare
    step on it as tensors on ``device``, on the learner's network."""
    from mpirl.actor_learner.batch_sources import Batch
    from mpirl.agents.tensors import to_tensors
    training = impala_learner(device, B)
    fields = impala_batch(B, T)
    batch = Batch(fields, np.ones(B, np.float32), None, B)

    def ours():
        if training.train(batch) is None:
            raise RuntimeError(f"IMPALA's train step skipped the bench's batch: {training.agent.fault}")

    net, c, a = training.agent.net, training.cfg.impala, training.cfg.agent
    b = {k: v.clone() for k, v in to_tensors(fields, device).items()}
    opt = torch.optim.Adam(net.parameters(), lr=a.lr, eps=a.adam_eps)

    def bare(bf16: bool):
        def step():
            optimize(net, opt, bare_impala_loss(net, b, a.gamma, c.rho_bar, c.c_bar, c.value_coef, c.entropy_coef,
                                                bf16), a.grad_clip)
        return step
    return ours, bare(False), bare(True), training


# -- PPO (the a3c family)

def _ppo_cfg(device: torch.device, U: int, E: int, epochs: int, minibatches: int):
    """PPO's Atari settings (Schulman et al. 2017 and CleanRL's: clip 0.1, GAE 0.95, Adam 2.5e-4, gradient norm
    0.5) with ``U`` steps of ``E`` games."""
    from mpirl.config import JobConfig
    cfg = JobConfig()
    a, p = cfg.agent, cfg.a3c
    a.algorithm, a.hidden, a.network, a.device = "a3c", list(HIDDEN), "nature", str(device)
    a.gamma, a.lr, a.adam_eps, a.grad_clip, a.reward_clip = 0.99, 2.5e-4, 1e-5, 0.5, 1.0
    a.normalize_obs = a.normalize_reward = False
    p.loss, p.unroll, p.epochs, p.minibatches = "ppo", U, epochs, minibatches
    p.clip, p.gae_lambda, p.entropy_coef, p.value_coef, p.normalize_advantages = 0.1, 0.95, 0.01, 0.5, True
    cfg.env.envs_per_actor, cfg.run.seed = E, 1
    return cfg


def ppo_rollout(U: int, E: int, seed: int = 0):
    """A filled :class:`~mpirl.agents.a3c.Rollout`: random frames and actions, behaviour log-probabilities near the
    uniform policy's, values, a few terminations, no truncation."""
    from mpirl.agents.a3c import Rollout
    rng = np.random.default_rng(seed)
    ro = Rollout(U, E, OBS, np.uint8, ACTIONS)
    ro.obs[:] = rng.integers(0, 256, ro.obs.shape, dtype=np.uint8)
    ro.action[:] = rng.integers(0, ACTIONS, ro.action.shape)
    ro.logp[:] = math.log(1 / ACTIONS) + 0.1 * rng.standard_normal(ro.logp.shape)
    ro.value[:] = 0.1 * rng.standard_normal(ro.value.shape)
    ro.reward[:] = rng.random(ro.reward.shape) < 0.1
    ro.terminated[:] = rng.random(ro.terminated.shape) < 0.01
    ro.bootstrap[:] = 0.1 * rng.standard_normal(E)
    ro.steps = U
    return ro


def ppo_steps(device: torch.device, U: int, E: int, epochs: int, minibatches: int):
    """``(ours, bare fp32, bare bf16, model)``: one PPO update of the rollout, ours from numpy through the a3c
    model's gradients and applies, bare on the rollout as tensors on ``device``, on the model's network."""
    from mpirl.agents.a3c import A3cModel
    from mpirl.agents.tensors import to_tensors
    from mpirl.algos.a3c.builder import A3cBuilder
    cfg = _ppo_cfg(device, U, E, epochs, minibatches)
    model = A3cModel(OBS, ACTIONS, cfg.agent, cfg.a3c, device, seed=1, optimizer=True)
    builder, rng = A3cBuilder(), np.random.default_rng(2)
    ro = ppo_rollout(U, E)
    grad = np.zeros(model.n_params, np.float32)

    def ours():
        p = model.prepare(ro)
        for parts in builder.passes(cfg, p.n, rng):
            for idx in parts:
                if model.gradient(p, idx, grad) is None:
                    raise RuntimeError(f"the a3c model refused the bench's rollout: {model.fault}")
                model.apply(grad)

    net, a, c = model.net, cfg.agent, cfg.a3c
    b = {k: v.clone() for k, v in to_tensors(ro.fields(), device).items()}
    obs, action, old = b["obs"].flatten(0, 1), b["action"].flatten(), b["logp"].flatten()
    opt = torch.optim.Adam(net.parameters(), lr=a.lr, eps=a.adam_eps)

    def bare(bf16: bool):
        def update():
            adv, ret = bare_gae(b["reward"], b["value"], b["bootstrap"], b["terminated"], a.gamma, c.gae_lambda)
            adv, ret = adv.flatten(), ret.flatten()
            for _ in range(epochs):
                for idx in torch.randperm(len(obs), device=device).chunk(minibatches):
                    optimize(net, opt, bare_ppo_loss(net, obs[idx], action[idx], old[idx], adv[idx], ret[idx], c.clip,
                                                     c.value_coef, c.entropy_coef, bf16), a.grad_clip)
        return update
    return ours, bare(False), bare(True), model
