"""What QMIX gives the actor loop (:mod:`mpirl.actor_learner.actor`), an inference worker (:mod:`mpirl.actor_learner.worker`)
and the actors it serves (:mod:`mpirl.actor_learner.env_actor`): the step message's rows, the actions' shape, an
actor's games and the decisions for one actor or a worker's several (:mod:`mpirl.algos.qmix.playing`)."""

from __future__ import annotations

from mpirl.algos.qmix.playing import Deciding, Games, step_spec  # noqa: F401 - the interface
from mpirl.job.context import RoleContext


def action_shape(spaces) -> tuple:
    return (spaces.n_agents,)


def games(ctx: RoleContext, label: str) -> Games:
    return Games(ctx.cfg, ctx.spaces, ctx.seed(), label)


def deciding(ctx: RoleContext, actors: list[int]) -> Deciding:
    """The decisions for ``actors`` (world ranks), each exploring from its own rank's seed."""
    import torch
    torch.set_num_threads(1)
    return Deciding(ctx.cfg, ctx.spaces, ctx.spec, [ctx.seed_of(a) for a in actors])
