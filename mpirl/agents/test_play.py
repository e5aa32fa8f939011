"""A test round: games played with a policy network (actions sampled, as the actors act), stepped together, on the
shared single-agent games (:class:`~mpirl.envs.games.VectorGames`: forced FIRE, rebuilt when a game raises)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from mpirl.envs.games import VectorGames

F8, I8 = np.float64, np.int64
# A test round's row (the learner's or the server's ``test`` table): when, after how much training, what it played.
TEST_COLUMNS = {"time": F8, "train_steps": I8, "env_steps": I8, "return_mean": F8, "return_std": F8,
                "length_mean": F8, "episodes": I8, "env_errors": I8, "seconds": F8}
MAX_TEST_STEPS = 108_000  # steps of one test round at most (30 minutes of Atari play); unfinished games not counted


def play_test(net: torch.nn.Module, cfg, spaces, n: int, seed: int, device: torch.device) -> dict:
    """``n`` episodes of ``net`` (``net(obs) -> (logits, values)``) on the job's environment, one game each: the
    finished games' mean return, its std, their mean length and how many finished. Games that raise are rebuilt
    (the failure printed and counted in ``env_errors``); the episodes they were playing are played again."""
    rng = np.random.default_rng(seed)
    one_each = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, envs_per_actor=n))
    games = VectorGames(one_each, spaces, int(rng.integers(2**31)), "test round")
    ret, length, done = np.zeros(n), np.zeros(n, np.int64), np.zeros(n, bool)
    try:
        out = games.start()
        for _ in range(MAX_TEST_STEPS):
            with torch.no_grad():
                logits, _ = net(torch.as_tensor(out.rows["obs"], device=device))
            logp = torch.log_softmax(logits.double(), dim=1).cpu().numpy()
            out = games.step(np.argmax(logp + rng.gumbel(size=logp.shape), axis=1))
            o = out.rows
            if out.fresh:  # rebuilt: the unfinished episodes start over
                ret[~done], length[~done] = 0.0, 0
                continue
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
