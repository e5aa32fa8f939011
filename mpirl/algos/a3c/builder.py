"""A3C (with DPPO's and DD-PPO's exchanges) as the gradient family sees it: the ``[a3c]`` section, the actor-critic
model and its rollouts (:mod:`mpirl.agents.a3c`), A2C's one gradient a rollout or PPO's passes of minibatches, and
the sampled policy's test round. The torch parts are imported where a rank makes them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np

from mpirl.config import JobConfig
from mpirl.gradients.builder import GradientBuilder, GradientModel, GradientRollout
from mpirl.job.context import RoleContext

if TYPE_CHECKING:
    from mpirl.algos.a3c.settings import A3cConfig


class A3cBuilder(GradientBuilder):
    def settings(self, cfg: JobConfig) -> A3cConfig:
        return cfg.a3c

    def make_model(self, ctx: RoleContext, optimizer: bool) -> GradientModel:
        from mpirl.agents.a3c import A3cModel
        from mpirl.agents.tensors import pick_device
        from mpirl.agents.schedules import scheduled
        from mpirl.agents.running_stats import needs_shift
        from mpirl.envs.factory import reference_observation
        cfg, a = ctx.cfg, ctx.cfg.a3c
        shift = reference_observation(cfg.env) if needs_shift(cfg.agent, ctx.spaces.obs_dtype) else None
        schedules = scheduled(cfg, {"lr": (cfg.agent.lr, cfg.agent.lr_final),
                                    "entropy_coef": (a.entropy_coef, a.entropy_final), "clip": (a.clip, a.clip_final)})
        return A3cModel(ctx.spaces.obs_shape, ctx.spaces.action, cfg.agent, a, pick_device(cfg.agent.device),
                        seed=cfg.run.seed, optimizer=optimizer, obs_shift=shift, schedules=schedules,
                        obs_dtype=ctx.spaces.obs_dtype)

    def make_rollout(self, ctx: RoleContext) -> GradientRollout:
        from mpirl.agents.a3c import Rollout
        s = ctx.spaces
        state = ctx.cfg.agent.hidden[-1] if ctx.cfg.agent.recurrent == "lstm" else 0
        # Normalised observations are floats (images too: pixels scaled and normalised as the policy acted on them)
        dtype = np.float32 if ctx.cfg.agent.normalize_obs else s.obs_dtype
        return Rollout(ctx.cfg.a3c.unroll, ctx.cfg.env.envs_per_actor, s.obs_shape, dtype, s.action, state)

    def passes(self, cfg: JobConfig, n: int, rng: np.random.Generator) -> Iterator[list[np.ndarray | None]]:
        """A2C: one gradient of the whole rollout; PPO: ``a3c.epochs`` passes of ``a3c.minibatches``."""
        a = cfg.a3c
        if a.loss != "ppo":
            yield [None]
            return
        from mpirl.agents.policy_gradient import minibatch_indices
        for _ in range(a.epochs):
            yield list(minibatch_indices(n, a.minibatches, rng))

    def play_test(self, model: GradientModel, ctx: RoleContext, episodes: int, seed: int) -> dict:
        """The actions sampled, as the workers act."""
        from mpirl.agents.a3c import A3cModel
        from mpirl.agents.test_play import play_test
        assert isinstance(model, A3cModel)
        return play_test(model.net, ctx.cfg, ctx.spaces, episodes, seed, model.device, model.normalize)
