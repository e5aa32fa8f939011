"""Vector environments for actors: k environments stepped together, same-step autoreset.

An actor owns one vector of ``k = env.envs_per_actor`` environments and steps it with
one action per environment. Two implementations share the interface:

* :class:`GymVector` -- k plain gymnasium envs (from :func:`mpirl.envs.factory.make_env`)
  stepped one after the other in this process;
* :class:`AtariVector` -- ``ale_py``'s C++ ``AtariVectorEnv``: Atari preprocessing
  (frame skip with max-pooling, 84x84 grayscale, frame stack, no-op starts, FIRE on
  reset) done natively, optionally on several threads.

"Same-step autoreset": when an episode ends, ``step`` resets that environment at once.
:class:`StepResult` carries both the last observation of the finished episode
(``final_obs``, for the n-step target) and the reset observation (``obs``, to act on).

Freshness contract: every array in a :class:`StepResult` (and the array returned by
``reset``) is newly allocated and is never written by the vector afterwards, so callers
may keep references (e.g. rows held in n-step windows) across later steps without
copying. When no episode ended, ``final_obs`` may be the very same array as ``obs``;
treat returned arrays as read-only.

Environment ids starting with ``"ALE/"`` (``"ALE/Breakout-v5"``) go to
:class:`AtariVector`; everything else to :class:`GymVector`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mpirl.config import EnvConfig
from mpirl.envs.atari import ale_game, atari_options, import_ale, is_ale_id
from mpirl.envs.factory import env_spaces, make_env, policy_spaces_of
from mpirl.envs.images import channels_last, to_channels_first



class StepResult(NamedTuple):
    """One step of k environments (arrays are fresh; see the module docstring).

    obs:        (k, *obs_shape) obs_dtype -- what to act on next; for an env whose
                episode ended this step it is already the reset observation.
    reward:     (k,) float32 -- the environment's raw, unclipped reward.
    terminated: (k,) bool -- the episode reached a terminal state (bootstrap with 0).
    truncated:  (k,) bool -- the episode was cut by a time limit (bootstrap from final_obs).
    final_obs:  (k, *obs_shape) obs_dtype -- for envs with terminated | truncated, the
                last observation of the finished episode; for the others equal to ``obs``.
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    # (k,) bool or None: a life was lost this step but the game goes on (Atari). Learners
    # that treat it as terminal cut the bootstrap there; episode statistics are unaffected.
    life_lost: np.ndarray | None = None


def env_seeds(seed: int, k: int) -> np.ndarray:
    """(k,) int64 seeds in [0, 2**31) derived from ``seed`` (ALE takes int32 seeds).

    Derived with ``SeedSequence`` rather than ``seed + i`` so that actors with nearby
    seeds do not share environment seeds.
    """
    return np.random.SeedSequence(seed).generate_state(k, dtype=np.uint32).astype(np.int64) % 2**31


class GymVector:
    """k gymnasium environments stepped in sequence in this process.

    Attributes: ``num_envs`` (k), ``obs_shape`` (tuple), ``obs_dtype`` (np.dtype),
    ``action`` (an :class:`~mpirl.envs.actions.ActionSpec`) and ``n_actions`` (Discrete spaces: their size; 0
    otherwise). Image observations come out channels first (:mod:`mpirl.envs.images`).
    """

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int = 0):
        self.seed = seed
        seeds = env_seeds(seed, num_envs)
        self.envs = [make_env(cfg, seed=int(s)) for s in seeds]
        self.num_envs = num_envs
        self.obs_shape, self.obs_dtype, self.action = policy_spaces_of(self.envs[0], cfg)
        self.n_actions = self.action.nvec[0] if self.action.kind == "discrete" else 0
        # Discrete actions from 0 go to the env as ints (the common case, kept fast); others through the spec.
        self._to_env = int if self.action.kind == "discrete" and not self.action.start else self.action.to_env
        self.move_channels = channels_last(self.envs[0].observation_space.shape, cfg.channels)

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset all envs (env i with a seed derived from ``seed``, default: the
        construction seed); returns obs (k, *obs_shape) obs_dtype."""
        seeds = env_seeds(self.seed if seed is None else seed, self.num_envs)
        return self._stack([env.reset(seed=int(s))[0] for env, s in zip(self.envs, seeds)])

    def step(self, actions: np.ndarray) -> StepResult:
        """Step env i with ``actions[i]`` ((k, *action shape): integers, or floats clipped to the space's bounds
        here); reset the envs that ended."""
        k, to_env = self.num_envs, self._to_env
        reward = np.zeros(k, np.float32)
        terminated, truncated = np.zeros(k, bool), np.zeros(k, bool)
        last, resets = [], {}
        for i, env in enumerate(self.envs):
            o, reward[i], terminated[i], truncated[i], _ = env.step(to_env(actions[i]))
            last.append(o)
            if terminated[i] or truncated[i]:
                resets[i] = env.reset()[0]
        final_obs = self._stack(last)  # np.stack copies: safe even if an env reuses its buffer
        obs = final_obs
        if resets:
            obs = self._stack([resets.get(i, o) for i, o in enumerate(last)])
        return StepResult(obs, reward, terminated, truncated, final_obs)

    def forced(self, actions: np.ndarray) -> np.ndarray:
        """The actions to execute: as chosen (see :meth:`AtariVector.forced`)."""
        return actions

    def _stack(self, rows: list) -> np.ndarray:
        batch = np.stack(rows).astype(self.obs_dtype, copy=False)
        return to_channels_first(batch) if self.move_channels else batch

    def close(self) -> None:
        for env in self.envs:
            env.close()


# --------------------------------------------------------------------------- Atari


class AtariVector:
    """k Atari games in ale-py's native vector env (``autoreset_mode="SameStep"``).

    Observations (k, frame_stack, 84, 84) uint8; ``n_actions`` is the game's minimal
    action set (Breakout: 4). Attributes as :class:`GymVector`.
    """

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int = 0):
        vector_env = import_ale()
        self.seed = seed
        self.game = ale_game(cfg.id)
        opts = atari_options(cfg)
        self._env = vector_env(self.game, num_envs=num_envs, autoreset_mode="SameStep", **opts)
        self.num_envs = num_envs
        self.obs_shape = tuple(self._env.single_observation_space.shape)
        self.obs_dtype = np.dtype(np.uint8)
        self.n_actions = int(self._env.single_action_space.n)
        self.life_loss_terminal = cfg.terminal_on_life_loss
        minimal = list(self._env.ale.get_action_set())
        fire = [i for i, a in enumerate(minimal) if getattr(a, "name", str(a)).endswith("FIRE")]
        # After a lost life the ball (Breakout) waits for FIRE: press it, as the reset does.
        self.fire = fire[0] if fire and cfg.fire_on_life_loss else None
        self.lives = None
        self.fire_next = np.zeros(num_envs, dtype=bool)

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset all games (seeds derived from ``seed``, default: the construction seed);
        returns obs (k, frame_stack, 84, 84) uint8 (older frames of the stack are zeros)."""
        obs, info = self._env.reset(seed=env_seeds(self.seed if seed is None else seed, self.num_envs))
        self.lives = np.asarray(info["lives"]).copy()
        self.fire_next[:] = False
        return obs

    def forced(self, actions: np.ndarray) -> np.ndarray:
        """The actions to execute (and record): FIRE for games that just lost a life."""
        if self.fire is None or not self.fire_next.any():
            return actions
        actions = np.array(actions, copy=True)
        actions[self.fire_next] = self.fire
        return actions

    def step(self, actions: np.ndarray) -> StepResult:
        """Step game i with ``actions[i]`` ((k,) integer array in [0, n_actions)).

        ale-py returns fresh arrays each step (checked in tests/test_envs.py). On steps
        where some game ended, ``info["final_obs"]`` holds the finished episodes' last
        observations in those rows and zeros in the others; we fill the others from obs.
        """
        obs, reward, terminated, truncated, info = self._env.step(np.asarray(actions, dtype=np.int64))
        ended = terminated | truncated
        final_obs = obs
        if ended.any():
            final_obs = info["final_obs"]
            final_obs[~ended] = obs[~ended]
        lives = np.asarray(info["lives"])
        life_lost = (lives < self.lives) & ~ended
        self.lives = lives.copy()
        self.fire_next = life_lost
        return StepResult(obs, reward.astype(np.float32), terminated, truncated, final_obs,
                          life_lost if self.life_loss_terminal else None)

    def close(self) -> None:
        self._env.close()


# --------------------------------------------------------------------------- entry points


def stacks_shift(cfg: EnvConfig) -> bool:
    """Whether a step's observation is the last one shifted by one frame plus the new frame (ale-py's frame
    stack), so a sender of frames once sends one frame a step (:mod:`mpirl.replay.frame_stream`)."""
    return is_ale_id(cfg.id)


def make_vector(cfg: EnvConfig, seed: int) -> GymVector | AtariVector:
    """The actor's ``cfg.envs_per_actor`` environments; ``seed`` is the default reset seed
    (GymVector also seeds each env's action space from it)."""
    cls = AtariVector if is_ale_id(cfg.id) else GymVector
    return cls(cfg, cfg.envs_per_actor, seed)


vector_spaces = env_spaces  # the spaces of one game of a vector: what one env of the id has
