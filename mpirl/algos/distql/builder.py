"""DistQL as the exchange family sees it: the ``[distql]`` section, the job's environment with integer states
(CartPole through its discretizer), the tabular tables (:mod:`mpirl.agents.tabular`: a worker's Q-learning, the
Q-server's merge) and an ε-greedy episode with the source's end penalty. No part imports torch; the environment
(gymnasium) is imported where a rank makes one."""

from __future__ import annotations

import random
from typing import Callable

from mpirl.agents.tabular import ServerTable, WorkerTable, end_penalty, epsilon_at, play_episode
from mpirl.config import JobConfig
from mpirl.exchange.builder import Environment, ExchangeBuilder, ExchangeSettings, Played, TableSpaces


class DistqlBuilder(ExchangeBuilder[WorkerTable]):
    def settings(self, cfg: JobConfig) -> ExchangeSettings:
        return cfg.distql

    def make_env(self, cfg: JobConfig, seed: int) -> Environment:
        from mpirl.envs.discrete import make_tabular_env
        return make_tabular_env(cfg.env, cfg.distql.bins, seed=seed)

    def make_worker_table(self, cfg: JobConfig, spaces: TableSpaces) -> WorkerTable:
        d = cfg.distql
        return WorkerTable(spaces.n_states, spaces.n_actions, d.gamma, d.eta0, d.eta_decay,
                           textbook=d.variant == "textbook")

    def make_server_table(self, cfg: JobConfig, spaces: TableSpaces) -> ServerTable:
        return ServerTable(spaces.n_states, spaces.n_actions, cfg.distql.server_eta, cfg.distql.eta_decay)

    def play_episode(self, cfg: JobConfig, env: Environment, table: WorkerTable, episode: int, rng: random.Random,
                     each_step: Callable[[], None] | None) -> Played:
        """ε = ``epsilon * epsilon_decay ** episode``; the end penalty (the source's: at any end; the textbook's:
        at a termination) added to the last reward."""
        d = cfg.distql
        eps = epsilon_at(episode, d.epsilon, d.epsilon_decay)
        ret, env_ret, length = play_episode(env, table, eps, rng, end_penalty(cfg.env.id, d.end_penalty),
                                            d.variant == "textbook", each_step)
        return Played(ret, env_ret, length, eps)
