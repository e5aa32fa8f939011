"""A test round: games played with a policy network (actions sampled, as the actors act), stepped together."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from mpirl.envs.vector import make_vector

MAX_TEST_STEPS = 108_000  # steps of one test round at most (30 minutes of Atari play); unfinished games not counted


def play_test(net: torch.nn.Module, env_cfg, n: int, seed: int, device: torch.device) -> dict:
    """``n`` episodes of ``net`` (``net(obs) -> (logits, values)``), one game each: the finished games' mean return,
    its std, their mean length and how many finished."""
    rng = np.random.default_rng(seed)
    games = make_vector(dataclasses.replace(env_cfg, envs_per_actor=n), seed=int(rng.integers(2**31)))
    ret, length, done = np.zeros(n), np.zeros(n, np.int64), np.zeros(n, bool)
    try:
        obs = games.reset()
        for _ in range(MAX_TEST_STEPS):
            with torch.no_grad():
                logits, _ = net(torch.as_tensor(obs, device=device))
            logp = torch.log_softmax(logits.double(), dim=1).cpu().numpy()
            step = games.step(games.forced(np.argmax(logp + rng.gumbel(size=logp.shape), axis=1)))
            ret[~done] += step.reward[~done]
            length[~done] += 1
            done |= step.terminated | step.truncated
            if done.all():
                break
            obs = step.obs
    finally:
        games.close()
    finished = ret[done]
    return {"return_mean": float(finished.mean()) if done.any() else math.nan,
            "return_std": float(finished.std()) if done.any() else math.nan,
            "length_mean": float(length[done].mean()) if done.any() else math.nan, "episodes": int(done.sum())}
