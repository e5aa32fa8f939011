"""DistQL's trained policy: the Q-server's merged table, greedy over the actions each state has seen (a state never
seen takes action 0): the table the server wrote into its file when the run ended (``qserver.h5``'s ``table``), or a
checkpoint's (``ckpt-<merges>.h5``: the one given, else the newest of a run that did not end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch import nn

from mpirl.agents.deployed import TableActions
from mpirl.agents.trained_policy import TrainedPolicy
from mpirl.config import JobConfig
from mpirl.envs.watched import TableGame
from mpirl.exchange.checkpoint import read_server
from mpirl.job.checkpoint import chosen


SERVER_FILE = "qserver.h5"  # the Q-server's rank file (mpirl.algos.distql.algorithm.rank_files)


class TablePolicy(TrainedPolicy):
    """Greedy actions of a Q-table; observations are state indices (``obs_shape = ()``)."""

    obs_shape = ()
    obs_dtype = np.dtype(np.int64)

    def __init__(self, cfg: JobConfig, q: np.ndarray, seen: np.ndarray, device: torch.device | str = "cpu"):
        super().__init__(cfg, device)
        best = np.where(seen, q, -np.inf)
        best[~seen.any(axis=1)] = 0.0  # a state never seen: every action ties, the first is taken
        self.actions = TableActions(best).to(self.device)

    def act(self, obs, state: Any = None, episode_start=None, deterministic: bool = True,
            rng: np.random.Generator | None = None) -> tuple[np.ndarray, Any]:
        batch, one = self.batched(obs)
        with torch.no_grad():
            a = self.actions(torch.as_tensor(batch, device=self.device)).cpu().numpy()
        return (a[0] if one else a), None

    def game(self, seed: int, render: bool):
        return TableGame(self.cfg.env, self.cfg.distql.bins, seed, render)

    def module(self) -> nn.Module:
        return self.actions


def _final_table(run_dir: Path) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``(q, seen, merges)`` of the table the server wrote when the run ended; None if it did not end."""
    try:
        with h5py.File(Path(run_dir) / SERVER_FILE, "r", locking=False) as f:
            g = f.get("table")
            if g is None or "q" not in g:
                return None
            return g["q"][()], g["seen"][()].astype(bool), int(g["merges"][()].max(initial=0))
    except OSError:
        return None


def load_policy(cfg: JobConfig, run_dir: Path, checkpoint: Path | None, device: torch.device) -> TablePolicy:
    final = None if checkpoint is not None else _final_table(run_dir)
    if final is not None:
        policy = TablePolicy(cfg, final[0], final[1], device)
        policy.source = f"{SERVER_FILE}'s final table"
        return policy
    path, source = chosen(run_dir, checkpoint)
    server = read_server(path)
    policy = TablePolicy(cfg, server["q"], server["seen"].astype(bool), device)
    policy.source = source
    return policy
