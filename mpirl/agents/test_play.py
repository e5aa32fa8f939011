"""A test round: games played with a policy network, stepped together, on the shared single-agent games
(:class:`~mpirl.envs.games.VectorGames`: forced FIRE, rebuilt when a game raises). Categorical policies' actions are
sampled, as the actors act; a Gaussian policy plays its means (the deterministic policy, as SB3's evaluation and the
MuJoCo literature report), clipped to the action space's bounds by the games."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from mpirl.agents.distributions import actor_outputs
from mpirl.agents.sampling import sample
from mpirl.envs.games import VectorGames

if TYPE_CHECKING:
    from mpirl.agents.actor_critic import ActorCritic

F8, I8 = np.float64, np.int64
# A test round's row (the learner's or the server's ``test`` table): when, after how much training, what it played.
TEST_COLUMNS = {"time": F8, "train_steps": I8, "env_steps": I8, "return_mean": F8, "return_std": F8,
                "length_mean": F8, "episodes": I8, "env_errors": I8, "seconds": F8}
MAX_TEST_STEPS = 108_000  # steps of one test round at most (30 minutes of Atari play); unfinished games not counted


def play_test(net: ActorCritic, cfg, spaces, n: int, seed: int, device: torch.device,
              normalize: Callable[[np.ndarray], np.ndarray] | None = None) -> dict:
    """``n`` episodes of ``net`` (an :class:`~mpirl.agents.actor_critic.ActorCritic`) on the job's environment, one
    game each: the
    finished games' mean return, its std, their mean length and how many finished. Games that raise are rebuilt
    (the failure printed and counted in ``env_errors``); the episodes they were playing are played again.
    ``normalize``: the job's observation normalisation, as the policy was trained with (not counted)."""
    rng = np.random.default_rng(seed)
    spec = net.spec
    one_each = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, envs_per_actor=n))
    games = VectorGames(one_each, spaces, int(rng.integers(2**31)), "test round")
    ret, length, done = np.zeros(n), np.zeros(n, np.int64), np.zeros(n, bool)
    h = c = torch.zeros(n, getattr(net, "state_size", 0), device=device)
    starts = np.ones(n, bool)
    try:
        out = games.start()
        for _ in range(MAX_TEST_STEPS):
            with torch.no_grad():
                obs = out.rows["obs"] if normalize is None else normalize(out.rows["obs"])
                if net.core is not None:  # a recurrent policy: each game's state, zeroed where its episode starts
                    head, _, h, c = net.unroll(torch.as_tensor(obs, device=device)[None], h, c,
                                               torch.as_tensor(starts, device=device)[None])
                    head = head[0]
                else:
                    head, _ = net(torch.as_tensor(obs, device=device))
            outputs = actor_outputs(spec, head)
            if spec.continuous:
                actions = outputs.astype(np.float32).reshape(n, *spec.shape)
            else:
                actions, _ = sample(spec, outputs, None, rng)
            out = games.step(actions)
            o = out.rows
            starts = np.zeros(n, bool)
            if out.fresh:  # rebuilt: the unfinished episodes start over
                ret[~done], length[~done] = 0.0, 0
                starts[:] = True
                continue
            starts = o["terminated"] | o["truncated"]
            ret[~done] += o["reward"][~done]
            length[~done] += 1
            done |= o["terminated"] | o["truncated"]
            if done.all():
                break
    finally:
        games.close()
    finished = ret[done]
    return {"return_mean": float(finished.mean()) if done.any() else math.nan,
            "return_std": float(finished.std()) if done.any() else math.nan,
            "length_mean": float(length[done].mean()) if done.any() else math.nan, "episodes": int(done.sum()),
            "env_errors": games.env_errors}
