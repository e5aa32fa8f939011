"""The games ``mpirl play`` records (mpirl/envs/watched.py), without a job: Atari's colour twin plays the same game
as the preprocessed one, MinAtar and PettingZoo draw RGB frames, an env that draws none is refused in one line, and
the deterministic action modules (mpirl/agents/deployed.py) do what the actors' numpy code does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpirl.agents.deployed import Normalize, _Actions
from mpirl.agents.running_stats import Normalization
from mpirl.config import ConfigError, EnvConfig
from mpirl.envs.actions import ActionSpec
from mpirl.envs.watched import AtariGame, GymGame, TeamGame, frame_of


def test_atari_twin_plays_the_same_game_in_colour():
    """Random actions for a few hundred steps, across lost lives and an episode end: the twin agrees on every reward
    and end (AtariGame.step raises otherwise), its frames are the full 210x160 colour screen."""
    game = AtariGame(EnvConfig(id="ALE/Breakout-v5", max_episode_steps=150), seed=3, render=True)
    rng = np.random.default_rng(0)
    try:
        obs = game.reset(11)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        ends = 0
        for _ in range(400):
            frame = game.frame()
            assert frame.shape == (210, 160, 3) and frame.dtype == np.uint8
            obs, _, done = game.step(int(rng.integers(4)))
            if done:
                ends += 1
                obs = game.reset(12 + ends)
        assert ends >= 2
    finally:
        game.close()


def test_minatar_and_team_frames():
    game = GymGame(EnvConfig(id="MinAtar/Breakout-v1"), seed=0, render=True)
    try:
        obs = game.reset(1)
        assert obs.shape[0] < obs.shape[1]  # channels first, as the actors give them
        frame = game.frame()
        assert frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8 and frame.max() > 0
    finally:
        game.close()
    from mpirl.envs.pettingzoo import make_team_env
    team = TeamGame(lambda rgb: make_team_env("predator_prey", 0, grid=5, n_predators=2, n_prey=1,
                                              render_mode="rgb_array" if rgb else None), "predator_prey", 20, True)
    try:
        (obs, avail), _ = team.reset(3), None
        assert avail.shape[0] == 2
        assert team.frame().shape == (80, 80, 3)
    finally:
        team.close()


def test_an_env_without_pictures_is_refused():
    with pytest.raises(ConfigError, match="--video.*without --video"):
        frame_of(None, "Taxi-v4")
    with pytest.raises(ConfigError, match="--video"):
        frame_of("ansi text", "predator_prey")
    assert frame_of(np.ones((4, 6, 3)), "x").max() == 255  # floats in [0, 1] scaled


def test_action_modules_match_the_numpy_side():
    norm = Normalization((3,), obs=True, reward=False, gamma=0.99)
    norm.obs.fold(np.array([4.0, 1, 2, 3, 5, 9, 14]))  # count 4, sums, sums of squares
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32) * 30
    assert np.allclose(Normalize(norm)(torch.as_tensor(x)).numpy(), norm.normalize(x), atol=1e-6)
    box = ActionSpec("box", (2,), low=np.array([-1.0, 0.0]), high=np.array([1.0, 2.0]))
    out = torch.tensor([[-3.0, 1.0], [0.5, 5.0]])
    assert np.allclose(_Actions(box)(out).numpy(), [[-1, 1], [0.5, 2]])
    multi = ActionSpec("multidiscrete", (2,), nvec=(2, 3), start=(1, -1))
    logits = torch.tensor([[0.0, 1.0, 5.0, 0.0, 0.0]])
    assert _Actions(multi)(logits).tolist() == [[2, -1]]
    one = ActionSpec("discrete", (), nvec=(3,), start=(5,))
    assert _Actions(one)(torch.tensor([[0.0, 2.0, 1.0]])).tolist() == [6]
    assert one.to_env(1) == 6 and multi.to_env(np.array([1, 0])).tolist() == [2, -1]


def test_a_drawing_package_that_is_missing_is_named():
    import gymnasium

    from mpirl.envs.watched import drawn

    def render():
        raise gymnasium.error.DependencyNotInstalled('pygame is not installed, run `pip install "gymnasium[x]"`')
    with pytest.raises(ConfigError, match=r"--video: 'CartPole-v1' cannot draw its frames here: "
                                          r"DependencyNotInstalled: pygame is not"):
        drawn(render, "CartPole-v1")
    with pytest.raises(ConfigError, match="package that is missing"):
        drawn(lambda: __import__("no_such_module_here"), "X-v0")


def test_mujoco_draws_without_a_display():
    """Without a display MuJoCo is told to draw through EGL before it is imported (a fresh process: MUJOCO_GL is read
    once, at mujoco's import). Where EGL is missing too, the refusal is one line naming MUJOCO_GL, not a crash."""
    import os
    import subprocess
    import sys
    script = ("from mpirl.config import ConfigError, EnvConfig\nfrom mpirl.envs.watched import GymGame\n"
              "g = GymGame(EnvConfig(id='Hopper-v5'), 0, True)\ng.reset(1)\n"
              "try:\n    f = g.frame()\n    print('frame', f.shape, f.dtype, int(f.max()))\n"
              "except ConfigError as err:\n    print('refused', err)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.strip()
    assert said == "frame (480, 480, 3) uint8 255" or ("refused" in said and "MUJOCO_GL" in said), said
