"""One game played for someone to watch (``mpirl play``): the job's environment with its own settings, reset with a
seed per episode, stepped with the environment's actions, and its picture (an RGB frame) on request. No policy, no
MPI.

* :class:`GymGame` — a Gymnasium env as the actors build it (:func:`~mpirl.envs.factory.make_env`: the time limit,
  flattened Dict observations; images moved channels first), rendered with ``render_mode="rgb_array"``.
* :class:`AtariGame` — ale-py's vector env of one game with the job's preprocessing (the observations the policy was
  trained on: frame skip, max-pool, 84x84 grayscale, frame stack, no-op starts, FIRE after a lost life). ale-py's
  vector env draws no pictures, so a second one-game vector with the same seed plays the same actions beside it with
  full-size colour frames and no stacking; both emulators step the same frames, and :meth:`AtariGame.step` checks
  that they agree on every reward and episode end.
* :class:`TableGame` — a Gymnasium env whose states a tabular learner indexes (DistQL: Taxi's states, CartPole's
  bins); the observation is the state's index.
* :class:`TeamGame` — a PettingZoo team (:class:`~mpirl.envs.pettingzoo.TeamEnv`) as QMIX's actors build it.

:func:`frame_of` turns what an env's ``render()`` gives into an ``(H, W, 3)`` uint8 frame, or says why it cannot.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

import numpy as np

from mpirl.config import ConfigError, EnvConfig
from mpirl.envs.atari import ale_game, atari_options, import_ale, is_ale_id
from mpirl.envs.factory import make_env
from mpirl.envs.images import channels_last, to_channels_first


def frame_of(picture: Any, env_id: str) -> np.ndarray:
    """``render()``'s picture as an ``(H, W, 3)`` uint8 RGB frame; ConfigError naming the env when there is none."""
    a = None if picture is None else np.asarray(picture)
    if a is None or a.ndim != 3 or a.shape[2] not in (3, 4) or a.size == 0:
        what = "nothing" if a is None else f"an array of shape {a.shape}"
        raise ConfigError("--video", f"{env_id!r} renders {what}, not RGB frames; play it without --video")
    if a.dtype != np.uint8:
        a = np.clip(a * (255.0 if a.dtype.kind in "fb" and a.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(a[:, :, :3])


def drawn(render, env_id: str):
    """``render()``'s picture; ConfigError naming what to install where the env's drawing needs a missing package
    (Gymnasium says which: ``DependencyNotInstalled``)."""
    try:
        return render()
    except ImportError as err:
        raise ConfigError("--video", f"{env_id!r} draws its frames with a package that is missing ({err}); install "
                                     "it, or play without --video") from None
    except Exception as err:  # noqa: BLE001 - DependencyNotInstalled, MuJoCo's FatalError without an OpenGL ...
        first = (str(err).strip().splitlines() or [""])[0][:300]
        gl = " (MuJoCo draws through OpenGL: MUJOCO_GL=egl or osmesa where no display is)" if "GL" in first else ""
        raise ConfigError("--video", f"{env_id!r} cannot draw its frames here: {type(err).__name__}: {first}{gl}; "
                                     "or play without --video") from None


def headless() -> None:
    """pygame (Gymnasium's classic control, PettingZoo's sisl and MPE) draws off screen: no display and no sound
    device wanted, and none asked for (SDL would look for them, and complain, on a machine without). MuJoCo, with no
    display to open a window on, draws through EGL (headless OpenGL; ``MUJOCO_GL`` is read when mujoco is first
    imported, so this must run before: ``mpirl play --video`` calls it first thing)."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")


class GymGame:
    """One Gymnasium game of the job's env; observations as the actors give them (channels first)."""

    def __init__(self, cfg: EnvConfig, seed: int, render: bool):
        if render:
            headless()
        try:
            self.env = make_env(cfg, seed=seed, render_mode="rgb_array" if render else None)
        except ConfigError as err:  # the job made this env: with a render mode, that mode is what it refuses
            if not render:
                raise
            raise ConfigError("--video", f"cannot make {cfg.id!r} render RGB frames ({err.message}); play it "
                                         "without --video") from None
        self.id, self.render = cfg.id, render
        self.move = channels_last(tuple(self.env.observation_space.shape or ()), cfg.channels)

    def _obs(self, o) -> np.ndarray:
        o = np.asarray(o)
        return to_channels_first(o[None])[0] if self.move else o

    def reset(self, seed: int) -> np.ndarray:
        return self._obs(self.env.reset(seed=seed)[0])

    def step(self, action) -> tuple[np.ndarray, float, bool]:
        o, r, terminated, truncated, _ = self.env.step(action)
        return self._obs(o), float(r), bool(terminated or truncated)

    def frame(self) -> np.ndarray:
        with warnings.catch_warnings():  # Gymnasium's checker on envs that render floats or declare no fps (MinAtar)
            warnings.simplefilter("ignore", UserWarning)
            return frame_of(drawn(self.env.render, self.id), self.id)

    def close(self) -> None:
        self.env.close()


class AtariGame:
    """One Atari game with the job's preprocessing (and, when rendered, its colour twin)."""

    def __init__(self, cfg: EnvConfig, seed: int, render: bool):
        vector_env, game = import_ale(), ale_game(cfg.id)
        opts = {**atari_options(cfg), "num_threads": 1}
        self.env = vector_env(game, num_envs=1, autoreset_mode="SameStep", **opts)
        self.twin = None
        if render:
            colour = {**opts, "grayscale": False, "img_height": 210, "img_width": 160, "stack_num": 1}
            self.twin = vector_env(game, num_envs=1, autoreset_mode="SameStep", **colour)
        minimal = list(self.env.ale.get_action_set())
        fire = [i for i, a in enumerate(minimal) if getattr(a, "name", str(a)).endswith("FIRE")]
        self.fire = fire[0] if fire and cfg.fire_on_life_loss else None
        self.lives, self.fire_next, self.picture = 0, False, None

    def reset(self, seed: int) -> np.ndarray:
        obs, info = self.env.reset(seed=np.array([seed]))
        self.lives, self.fire_next = int(np.asarray(info["lives"])[0]), False
        if self.twin is not None:
            self.picture = self._last(self.twin.reset(seed=np.array([seed]))[0])
        return obs[0]

    def step(self, action) -> tuple[np.ndarray, float, bool]:
        a = np.array([self.fire if self.fire_next else int(action)], np.int64)
        obs, reward, terminated, truncated, info = self.env.step(a)
        done = bool(terminated[0] or truncated[0])
        lives = int(np.asarray(info["lives"])[0])
        self.fire_next, self.lives = self.fire is not None and lives < self.lives and not done, lives
        if self.twin is not None:
            pic, r2, t2, u2, _ = self.twin.step(a)
            if float(r2[0]) != float(reward[0]) or bool(t2[0] or u2[0]) != done:
                raise RuntimeError("the Atari game and its colour twin diverged (a reward or an episode end differs); "
                                   "the video would not show the game played: play without --video")
            self.picture = self._last(pic)
        return obs[0], float(reward[0]), done

    @staticmethod
    def _last(obs: np.ndarray) -> np.ndarray:
        """The colour twin's newest frame ``(210, 160, 3)`` of its one game's observation (a stack of one)."""
        return obs[0].reshape(-1, *obs.shape[-3:])[-1]

    def frame(self) -> np.ndarray:
        return frame_of(self.picture, "Atari")

    def close(self) -> None:
        self.env.close()
        if self.twin is not None:
            self.twin.close()


class TableGame(GymGame):
    """One game of a tabular job's env: observations are state indices (:mod:`mpirl.envs.discrete`)."""

    def __init__(self, cfg: EnvConfig, bins, seed: int, render: bool):
        super().__init__(cfg, seed, render)
        from mpirl.envs.discrete import discretizer_for
        self.discretize = discretizer_for(cfg.id, self.env.observation_space, bins)

    def _obs(self, o) -> np.ndarray:
        return np.asarray(self.discretize(np.asarray(o)) if self.discretize else int(o), np.int64)


class TeamGame:
    """One multi-agent game as QMIX's actors build it: ``reset`` and ``step`` give ``(obs [n, ...], avail [n, A])``
    and the team's reward; an episode also ends at the job's episode limit."""

    def __init__(self, make, env_id: str, limit: int, render: bool):
        if render:
            headless()
        self.team = make(render)
        self.id, self.limit, self.length = env_id, limit, 0

    def reset(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        obs, avail, _ = self.team.reset(seed=seed)
        self.length = 0
        return obs, avail

    def step(self, actions) -> tuple[tuple[np.ndarray, np.ndarray], float, bool]:
        r = self.team.step(actions)
        self.length += 1
        return (r.obs, r.mask), float(r.reward), bool(r.terminated or r.truncated or self.length >= self.limit)

    def frame(self) -> np.ndarray:
        with warnings.catch_warnings():  # pursuit asks pygame for a font this machine may lack
            warnings.simplefilter("ignore", UserWarning)
            return frame_of(drawn(self.team.env.render, self.id), self.id)

    def close(self) -> None:
        self.team.close()


def single_game(cfg: EnvConfig, seed: int, render: bool) -> GymGame | AtariGame:
    """The game a single-agent policy of the job plays."""
    one = dataclasses.replace(cfg, envs_per_actor=1)
    return AtariGame(one, seed, render) if is_ale_id(cfg.id) else GymGame(one, seed, render)
