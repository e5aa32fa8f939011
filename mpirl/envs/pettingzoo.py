"""PettingZoo ParallelEnvs as fixed-order arrays for cooperative learners (QMIX).

:class:`TeamEnv` wraps any PettingZoo ``ParallelEnv`` whose agents are alike (same ``Box``
observation space, same ``Discrete`` action space) and speaks arrays in ``possible_agents``
order: ``reset() -> (obs [n, *obs_shape], mask bool [n, A], state)`` and
``step(actions int [n]) -> TeamStep``.

Team reward (``reward=``):

* ``"same"``: every agent receives the identical team reward (e.g. :mod:`mpirl.envs.predator_prey`):
  it is used once, not n times (the agents' values are checked to be equal);
* ``"mean"``: the mean over the agents that got a reward this step;
* ``"sum"``: their sum.

What pursuit gives (read in ``pettingzoo/sisl/pursuit``, PettingZoo 1.27): pursuit is an AEC env
turned parallel, one sub-step per pursuer. After every sub-step each pursuer's local reward is
``tag_reward`` x (evaders next to it) / n_pursuers, and after the last sub-step of a cycle also
``catch_reward`` x (evaders it helped remove) + ``urgency_reward``; with the default
``shared_reward=True`` (``local_ratio = 0``) every pursuer is then given the *mean* of these local
rewards, and the parallel wrapper sums what each pursuer was given over the n sub-steps. So
every pursuer receives the same number each parallel step (the tests check it). ``"mean"``
returns exactly that value once (``"sum"`` would count it n times), and stays the right choice
with ``shared_reward=False``, where the pursuers' values differ.
mpe2's ``simple_spread_v3`` gives each agent ``(1 - local_ratio) * global + local_ratio * local_i``
(global: the landmark coverage, identical for all; local: the agent's collision penalty); its
team reward here is ``"mean"``: the global term once plus the mean collision penalty.

``terminated`` and ``truncated`` stay apart: the episode ends when the env's ``agents`` list is
empty; it is *truncated* when some agent finishing in that step was truncated and not all of
them were terminated (a time limit: the learner bootstraps), otherwise *terminated*.

Agents missing from a step's dicts (they left the episode): zero observation, and a mask with
only the no-op legal when the env names one (``noop=`` or the env's ``noop_action``
attribute), all actions legal otherwise; their actions are not sent to the env.

State: ``env.state()`` when the env declares a ``state_space`` (predator_prey, pursuit_v5 from
PettingZoo 1.27, mpe2), cast to that space's dtype; otherwise the agents' observations
flattened and concatenated in agent order (``state_source == "observations"``).

Action masks, first found: ``infos[agent]["action_mask"]``; a dict observation
``{"observation", "action_mask"}``; the env's ``action_mask(agent)``; otherwise all legal.

Nothing here imports pettingzoo at module import time: a missing package raises
:class:`~mpirl.envs.marl_install.MarlDependencyError` naming the install that provides it
(:mod:`mpirl.envs.marl_install`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import math
from typing import Any, Callable, NamedTuple

import numpy as np
from gymnasium import spaces

from mpirl.envs.marl_install import import_for, missing_package

REWARD_MODES = ("same", "mean", "sum")


def _pz_env_classes():
    mod = import_for("pettingzoo.utils.env", "a multi-agent environment")
    return mod.ParallelEnv, mod.AECEnv


class TeamSpaces(NamedTuple):
    """What a learner needs to size its networks and replay for one team env."""

    agents: tuple[str, ...]
    n_agents: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    state_shape: tuple[int, ...]
    state_dtype: np.dtype
    n_actions: int
    state_source: str  # "env" (env.state()) or "observations" (concatenated observations)
    dict_obs: bool  # observations are {"observation", "action_mask"} dicts


class TeamStep(NamedTuple):
    obs: np.ndarray  # [n, *obs_shape], obs_dtype
    mask: np.ndarray  # bool [n, n_actions]
    state: np.ndarray  # state_shape, state_dtype
    reward: float  # the team reward, counted once
    terminated: bool
    truncated: bool
    info: dict  # at the episode end: episode_return, episode_length and the env's episode_stats()


def _name(env: Any) -> str:
    meta = getattr(env, "metadata", None)
    if isinstance(meta, dict) and meta.get("name"):
        return str(meta["name"])
    return type(env).__name__


def _obs_box(space: spaces.Space) -> tuple[spaces.Space, bool]:
    """The array part of an observation space and whether it is a {"observation", "action_mask"} dict."""
    if isinstance(space, spaces.Dict) and "observation" in space.spaces:
        return space.spaces["observation"], True
    return space, False


def check_team_env(env: Any) -> None:
    """Raise ``ValueError`` with a one-sentence reason when ``env`` cannot be a :class:`TeamEnv`."""
    parallel_cls, aec_cls = _pz_env_classes()
    name = _name(env)
    if isinstance(env, aec_cls):
        raise ValueError(f"{name} is a PettingZoo AEC env (agents act one at a time); use its parallel_env() "
                         "for a team of simultaneous agents")
    if not isinstance(env, parallel_cls):
        raise ValueError(f"{name} ({type(env).__module__}.{type(env).__qualname__}) is not a PettingZoo "
                         "ParallelEnv")
    agents = list(getattr(env, "possible_agents", None) or [])
    if not agents:
        raise ValueError(f"{name} declares no possible_agents; the team's agent order comes from them")
    first = agents[0]
    obs0, act0 = env.observation_space(first), env.action_space(first)
    for agent in agents[1:]:
        obs, act = env.observation_space(agent), env.action_space(agent)
        if obs != obs0:
            raise ValueError(f"{name} has heterogeneous agents: {first} observes {obs0} but {agent} observes "
                             f"{obs}; a team env needs identical agents")
        if act != act0:
            raise ValueError(f"{name} has heterogeneous agents: {first} acts in {act0} but {agent} in {act}; "
                             "a team env needs identical agents")
    if not isinstance(act0, spaces.Discrete):
        raise ValueError(f"{name} has action space {act0}; a team env needs Discrete actions "
                         "(for mpe2, pass continuous_actions=False)")
    if int(act0.start) != 0:
        raise ValueError(f"{name} has action space {act0} starting at {int(act0.start)}; a team env needs "
                         "actions numbered from 0")
    box, _ = _obs_box(obs0)
    if not isinstance(box, spaces.Box):
        raise ValueError(f"{name} has observation space {obs0}; a team env needs array (Box) observations")
    state_space = getattr(env, "state_space", None)
    if state_space is not None and not isinstance(state_space, spaces.Box):
        raise ValueError(f"{name} has state space {state_space}; a team env needs an array (Box) state")


def describe(env: Any) -> TeamSpaces:
    """Check ``env`` (:func:`check_team_env`) and return its :class:`TeamSpaces` (no reset needed)."""
    check_team_env(env)
    agents = tuple(env.possible_agents)
    box, dict_obs = _obs_box(env.observation_space(agents[0]))
    obs_shape, obs_dtype = tuple(box.shape), np.dtype(box.dtype)
    state_space = getattr(env, "state_space", None)
    if state_space is not None:
        state_shape, state_dtype, source = tuple(state_space.shape), np.dtype(state_space.dtype), "env"
    else:
        state_shape, state_dtype, source = (len(agents) * math.prod(obs_shape),), obs_dtype, "observations"
    return TeamSpaces(agents=agents, n_agents=len(agents), obs_shape=obs_shape, obs_dtype=obs_dtype,
                      state_shape=state_shape, state_dtype=state_dtype,
                      n_actions=int(env.action_space(agents[0]).n), state_source=source, dict_obs=dict_obs)


class TeamEnv:
    """A PettingZoo ParallelEnv as arrays in ``possible_agents`` order (see the module docstring)."""

    def __init__(self, env: Any, reward: str = "same", noop: int | None = None, seed: int | None = None):
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {', '.join(REWARD_MODES)}, got {reward!r}")
        self.spaces = describe(env)
        self.env = env
        self.reward_mode = reward
        sp = self.spaces
        self.agents = sp.agents
        self.n_agents, self.n_actions = sp.n_agents, sp.n_actions
        self.obs_shape, self.obs_dtype = sp.obs_shape, sp.obs_dtype
        self.state_shape, self.state_dtype = sp.state_shape, sp.state_dtype
        if noop is None:
            noop = getattr(getattr(env, "unwrapped", env), "noop_action", None)
        if noop is not None and not 0 <= int(noop) < self.n_actions:
            raise ValueError(f"noop action {noop} is outside 0..{self.n_actions - 1}")
        self.noop = None if noop is None else int(noop)
        self._missing_mask = np.zeros(self.n_actions, bool)
        if self.noop is None:
            self._missing_mask[:] = True
        else:
            self._missing_mask[self.noop] = True
        mask_fn = getattr(env, "action_mask", None)
        self._mask_fn: Callable[[str], Any] | None = mask_fn if callable(mask_fn) else None
        self._index = {a: i for i, a in enumerate(self.agents)}
        self._fast = not self.spaces.dict_obs
        self._pending_seed = seed
        self._done = True
        self._return = 0.0
        self._length = 0
        self._last_obs: np.ndarray | None = None

    # ----- episode ------------------------------------------------------------------------

    def reset(self, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Start an episode: ``(obs [n, *obs_shape], mask bool [n, A], state)``.

        Without ``seed``, the first reset uses the seed the TeamEnv was made with (if any);
        ``options`` go to the env's reset.
        """
        if seed is None:
            seed, self._pending_seed = self._pending_seed, None
        obs_d, infos = self.env.reset(seed=seed, options=options)
        obs, mask = self._arrays(obs_d, infos)
        self._done = False
        self._return, self._length = 0.0, 0
        return obs, mask, self._state(obs)

    def step(self, actions) -> TeamStep:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        acts = np.asarray(actions)
        if acts.shape != (self.n_agents,):
            raise ValueError(f"actions must have shape ({self.n_agents},), got {acts.shape}")
        acts = acts.tolist()
        index = self._index
        live = self.env.agents
        obs_d, rew_d, term_d, trunc_d, infos = self.env.step({a: acts[index[a]] for a in live})
        reward = self._team_reward(rew_d)
        obs, mask = self._arrays(obs_d, infos)
        self._return += reward
        self._length += 1
        info: dict = {}
        terminated = truncated = False
        if not self.env.agents:
            self._done = True
            truncated = any(trunc_d.values()) and not all(term_d.get(a, False) for a in trunc_d)
            terminated = not truncated
            info = {"episode_return": self._return, "episode_length": self._length}
            stats = getattr(getattr(self.env, "unwrapped", self.env), "episode_stats", None)
            if callable(stats):
                info.update(stats())
        return TeamStep(obs, mask, self._state(obs), reward, terminated, truncated, info)

    def state(self) -> np.ndarray:
        """The current global state (see the module docstring for where it comes from)."""
        if self.spaces.state_source == "env":
            return np.asarray(self.env.state(), dtype=self.state_dtype)
        if self._last_obs is None:
            raise RuntimeError("state() before reset()")
        return self._last_obs.reshape(-1).copy()

    def close(self) -> None:
        self.env.close()

    # ----- internals ----------------------------------------------------------------------

    def _state(self, obs: np.ndarray) -> np.ndarray:
        self._last_obs = obs
        return self.state()

    def _team_reward(self, rew_d: dict) -> float:
        values = [float(v) for v in rew_d.values()]
        if not values:
            return 0.0
        if self.reward_mode == "same":
            first = values[0]
            if any(v != first for v in values):
                raise ValueError(f"reward='same' but the agents of {_name(self.env)} got different rewards "
                                 f"({min(values)} .. {max(values)}); use reward='mean' or 'sum'")
            return first
        total = math.fsum(values)
        return total / len(values) if self.reward_mode == "mean" else total

    def _arrays(self, obs_d: dict, infos: dict) -> tuple[np.ndarray, np.ndarray]:
        if self._fast:  # every agent present, masks in infos (switched off the first time it is not so)
            try:
                obs = np.array([obs_d[a] for a in self.agents], dtype=self.obs_dtype)
                mask = np.array([infos[a]["action_mask"] for a in self.agents], dtype=bool)
            except (KeyError, TypeError, ValueError):
                self._fast = False
            else:
                if obs.shape[1:] == self.obs_shape and mask.shape == (self.n_agents, self.n_actions):
                    return obs, mask
        n = self.n_agents
        obs = np.zeros((n, *self.obs_shape), self.obs_dtype)
        mask = np.empty((n, self.n_actions), bool)
        dict_obs, mask_fn = self.spaces.dict_obs, self._mask_fn
        for i, agent in enumerate(self.agents):
            o = obs_d.get(agent)
            if o is None:
                mask[i] = self._missing_mask
                continue
            m = None
            info = infos.get(agent)
            if info and "action_mask" in info:
                m = info["action_mask"]
            if dict_obs:
                if m is None:
                    m = o["action_mask"]
                o = o["observation"]
            obs[i] = o
            if m is None and mask_fn is not None:
                m = mask_fn(agent)
            mask[i] = True if m is None else m
        return obs, mask


# ----- known env ids ---------------------------------------------------------------------------


def _predator_prey(kwargs: dict) -> TeamEnv:
    mod = import_for("mpirl.envs.predator_prey", "predator_prey")
    return TeamEnv(mod.PredatorPrey(**kwargs), reward="same")


def _pursuit(kwargs: dict) -> TeamEnv:
    # through PettingZoo's registry (1.27+): importing pettingzoo.sisl.pursuit_v5 directly warns
    pz = import_for("pettingzoo", "pettingzoo.sisl.pursuit_v5")
    errors = import_for("pettingzoo.env_registry.exceptions", "pettingzoo.sisl.pursuit_v5")
    try:
        env = pz.make("parallel", "sisl/pursuit-v5", **kwargs)
    except errors.FailedToImport as err:
        missing = getattr(err.__cause__, "name", None) or "pygame"
        raise missing_package("pettingzoo.sisl.pursuit_v5", missing) from None
    return TeamEnv(env, reward="mean", noop=4)  # pursuit's action 4: stay


def _simple_spread(kwargs: dict) -> TeamEnv:
    mod = import_for("mpe2.simple_spread_v3", "mpe2.simple_spread_v3")
    kwargs = {"continuous_actions": False, **kwargs}
    return TeamEnv(mod.parallel_env(**kwargs), reward="mean", noop=0)  # action 0: no move


def _any_parallel(env_id: str, kwargs: dict) -> TeamEnv:
    """Any PettingZoo env module by its import path, if it offers a ParallelEnv (its team reward: the mean)."""
    try:
        mod = importlib.import_module(env_id)
    except ModuleNotFoundError as err:
        if err.name and env_id.startswith(err.name):
            raise ValueError(f"no module {env_id!r}; known ids: {', '.join(TEAM_ENVS)}, or a PettingZoo env "
                             "module such as pettingzoo.sisl.pursuit_v5") from None
        raise missing_package(env_id, err.name) from None
    if not callable(getattr(mod, "parallel_env", None)):
        raise ValueError(f"{env_id} has no parallel_env(): it is an AEC (turn-based) env only, and QMIX steps "
                         "every agent at once (a ParallelEnv)")
    return TeamEnv(mod.parallel_env(**kwargs), reward="mean")


TEAM_ENVS: dict[str, Callable[[dict], TeamEnv]] = {
    "predator_prey": _predator_prey,
    "pettingzoo.sisl.pursuit_v5": _pursuit,
    "mpe2.simple_spread_v3": _simple_spread,
}


def make_team_env(env_id: str, seed: int | None = None, **kwargs) -> TeamEnv:
    """A :class:`TeamEnv` for a known id; ``seed`` seeds its first reset; ``kwargs`` go to the env.

    Raises ``ValueError`` for an unknown id or bad settings, :class:`~mpirl.envs.marl_install.MarlDependencyError` when the
    env's package is missing.
    """
    make = TEAM_ENVS.get(env_id)
    if make is None and env_id.split(".")[0] in ("pettingzoo", "mpe2") and env_id.count(".") >= 1:
        make = functools.partial(_any_parallel, env_id)
    if make is None:
        raise ValueError(f"unknown multi-agent env {env_id!r}; known: {', '.join(TEAM_ENVS)}, or any PettingZoo "
                         "ParallelEnv module as pettingzoo.<family>.<name> (or mpe2.<name>)")
    try:
        team = make(dict(kwargs))
    except TypeError as err:  # an unknown keyword for the env's constructor
        raise ValueError(f"bad settings for {env_id}: {err}") from None
    team._pending_seed = seed
    return team


LIMIT_KEYWORDS = ("max_cycles", "max_steps")  # PettingZoo's name for an env's episode limit; predator_prey's


def own_episode_limit(team: TeamEnv) -> tuple[str, int] | None:
    """``(keyword, steps)``: the episode limit the env keeps and the constructor keyword that sets it (PettingZoo's
    envs keep their ``max_cycles``, possibly on an inner env; predator_prey its ``max_steps``), read off the env
    and its wrappers; None where none of them says."""
    todo, seen = [team.env], set()
    while todo:
        obj = todo.pop(0)
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        attrs = getattr(obj, "__dict__", {})
        for key in LIMIT_KEYWORDS:
            value = attrs.get(key)
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
                return key, int(value)
        todo += [attrs.get(inner) for inner in ("env", "aec_env", "_env")]
        todo.append(getattr(obj, "unwrapped", None))
    return None


def team_env_spaces(env_id: str, **kwargs) -> TeamSpaces:
    """The :class:`TeamSpaces` of a known id with these settings (builds the env once, then closes it)."""
    team = make_team_env(env_id, None, **kwargs)
    try:
        return team.spaces
    finally:
        team.close()
