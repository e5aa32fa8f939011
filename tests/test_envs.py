"""Vector environments (no MPI): shapes, same-step autoreset, fresh arrays, Atari ids."""

import time

import ale_py  # noqa: F401  (in the test extra: a missing one fails)
import gymnasium as gym
import numpy as np
import pytest

from mpirl.config import ConfigError, EnvConfig
from mpirl.envs.factory import env_spaces
from mpirl.envs.atari import ale_game
from mpirl.envs.vector import AtariVector, GymVector, StepResult, make_vector, vector_spaces



def run_until_episode_end(vec, rng, max_steps):
    """Random actions until some env's episode ends; returns (obs before, result, steps)."""
    obs = vec.reset(seed=0)
    for step in range(1, max_steps + 1):
        res = vec.step(rng.integers(vec.n_actions, size=vec.num_envs))
        if (res.terminated | res.truncated).any():
            return obs, res, step
        obs = res.obs
    pytest.fail(f"no episode ended within {max_steps} steps")


def check_step_result(vec, res: StepResult):
    k = vec.num_envs
    assert isinstance(res, StepResult)
    assert res.obs.shape == res.final_obs.shape == (k, *vec.obs_shape)
    assert res.obs.dtype == res.final_obs.dtype == vec.obs_dtype
    assert res.reward.shape == res.terminated.shape == res.truncated.shape == (k,)
    assert res.reward.dtype == np.float32
    assert res.terminated.dtype == res.truncated.dtype == np.bool_


# --------------------------------------------------------------------------- gymnasium


def test_gym_vector_shapes_and_autoreset():
    vec = make_vector(EnvConfig(id="CartPole-v1", envs_per_actor=3), seed=1)
    assert isinstance(vec, GymVector)
    assert (vec.num_envs, vec.obs_shape, vec.obs_dtype, vec.n_actions) == (3, (4,), np.float32, 2)
    obs = vec.reset(seed=0)
    assert obs.shape == (3, 4) and obs.dtype == np.float32
    check_step_result(vec, vec.step(np.zeros(3, np.int64)))

    _, res, _ = run_until_episode_end(vec, np.random.default_rng(0), 1000)
    check_step_result(vec, res)
    ended = res.terminated | res.truncated
    for i in np.flatnonzero(ended):
        assert not np.array_equal(res.final_obs[i], res.obs[i])
        assert np.abs(res.obs[i]).max() <= 0.05  # CartPole resets to U(-0.05, 0.05)
        assert np.abs(res.final_obs[i]).max() > 0.05  # a terminal state is out of bounds
    assert np.array_equal(res.final_obs[~ended], res.obs[~ended])
    assert res.reward.tolist() == [1.0, 1.0, 1.0]
    vec.close()


def test_gym_vector_arrays_are_fresh():
    vec = GymVector(EnvConfig(id="CartPole-v1"), 3, seed=2)
    a = vec.reset()
    b = vec.reset()
    np.testing.assert_array_equal(a, b)  # the construction seed is the default reset seed
    arrays = lambda res: [x for x in res if x is not None]  # noqa: E731 (life_lost is None here)
    first = vec.step(np.ones(3, np.int64))
    assert first.life_lost is None
    kept = [x.copy() for x in arrays(first)]
    for x in arrays(first):
        x[...] = 0  # mutate everything we were given
    second = vec.step(np.ones(3, np.int64))
    for x in arrays(second):
        assert all(not np.shares_memory(x, y) for y in arrays(first))
    # Same seed, same actions, on a fresh vector: identical results despite the mutation.
    again = GymVector(EnvConfig(id="CartPole-v1"), 3, seed=2)
    again.reset()
    for x, y in zip(arrays(again.step(np.ones(3, np.int64))), kept):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(again.step(np.ones(3, np.int64)), second):
        np.testing.assert_array_equal(x, y)


def test_vector_spaces_for_gym_ids_match_env_spaces():
    cfg = EnvConfig(id="CartPole-v1")
    assert vector_spaces(cfg) == env_spaces(cfg) == ((4,), np.dtype(np.float32), 2)


# --------------------------------------------------------------------------- Atari


@pytest.mark.parametrize("env_id, game", [("ALE/Breakout-v5", "breakout"), ("ALE/SpaceInvaders-v5", "space_invaders"),
                                          ("ALE/MsPacman-v5", "ms_pacman"), ("ALE/TicTacToe3D-v5", "tic_tac_toe_3d"),
                                          ("ALE/Pong", "pong"), ("ALE/space_invaders-v4", "space_invaders")])
def test_ale_id_to_game(env_id, game):
    assert ale_game(env_id) == game


def test_unknown_atari_game_names_env_id_and_close_games():
    with pytest.raises(ConfigError) as err:
        make_vector(EnvConfig(id="ALE/Breakot-v5"), seed=0)
    assert err.value.key == "env.id" and "ALE/Breakout-v5" in str(err.value)
    with pytest.raises(ConfigError) as err:
        env_spaces(EnvConfig(id="ALE/Breakout-ram-v5"))
    assert err.value.key == "env.id" and "RAM" in str(err.value)


def test_env_spaces_for_atari():
    t = time.perf_counter()
    assert env_spaces(EnvConfig(id="ALE/Breakout-v5")) == ((4, 84, 84), np.dtype(np.uint8), 4)
    assert env_spaces(EnvConfig(id="ALE/SpaceInvaders-v5"))[2] == 6
    print(f"env_spaces for two ALE ids: {time.perf_counter() - t:.2f} s")


def test_atari_vector_breakout_episode_end():
    vec = make_vector(EnvConfig(id="ALE/Breakout-v5", envs_per_actor=2), seed=3)
    assert isinstance(vec, AtariVector)
    assert (vec.num_envs, vec.obs_shape, vec.obs_dtype, vec.n_actions) == (2, (4, 84, 84), np.uint8, 4)
    obs = vec.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8

    prev, res, steps = run_until_episode_end(vec, np.random.default_rng(0), 3000)  # ~120-350 steps with random play
    check_step_result(vec, res)
    ended = res.terminated | res.truncated
    assert res.terminated[ended].all()  # game over, not the 27,000-step limit
    for i in np.flatnonzero(ended):
        # The final stack continues the previous one; the reset stack starts from blank frames.
        np.testing.assert_array_equal(res.final_obs[i, :3], prev[i, 1:])
        assert res.final_obs[i, 0].any() and not res.obs[i, 0].any() and res.obs[i, -1].any()
    np.testing.assert_array_equal(res.final_obs[~ended], res.obs[~ended])
    vec.close()


def test_atari_vector_rewards_unclipped_and_arrays_fresh():
    vec = AtariVector(EnvConfig(id="ALE/Breakout-v5"), 2, seed=4)
    vec.reset()
    rng = np.random.default_rng(1)
    results, copies = [], []
    for _ in range(400):
        res = vec.step(rng.integers(4, size=2))
        results.append(res)
        copies.append([x.copy() for x in res])
    # Nothing handed out earlier was overwritten by later steps.
    for res, kept in zip(results, copies):
        for x, y in zip(res, kept):
            np.testing.assert_array_equal(x, y)
    rewards = np.concatenate([r.reward for r in results])
    assert rewards.dtype == np.float32 and rewards.sum() > 0
    # Breakout gives 1, 4 or 7 per brick row; only unclipped rewards can exceed 1.
    assert set(np.unique(rewards)) <= {0.0, 1.0, 4.0, 7.0}


def test_atari_truncation_from_max_episode_steps():
    vec = AtariVector(EnvConfig(id="ALE/Breakout-v5", max_episode_steps=20), 1, seed=5)
    prev = vec.reset()
    for step in range(1, 40):
        res = vec.step(np.zeros(1, np.int64))  # NOOP: Breakout never ends on its own
        if res.truncated[0]:
            break
        prev = res.obs
    assert res.truncated[0] and not res.terminated[0] and step <= 20
    np.testing.assert_array_equal(res.final_obs[0, :3], prev[0, 1:])


def test_atari_config_errors_name_the_field():
    with pytest.raises(ConfigError) as err:
        vector_spaces(_with(frameskip=0))
    assert err.value.key == "env.frameskip"
    with pytest.raises(ConfigError) as err:
        make_vector(_with(repeat_action_probability=1.5), seed=0)
    assert err.value.key == "env.repeat_action_probability"


def _with(**fields) -> EnvConfig:
    """An EnvConfig for Breakout with extra fields set (works before config.py declares them)."""
    cfg = EnvConfig(id="ALE/Breakout-v5")
    for name, value in fields.items():
        object.__setattr__(cfg, name, value)
    return cfg


def test_atari_vector_speed(capsys):
    """Steps/s of 4 games on 1 thread (printed, not asserted: machines differ)."""
    vec = AtariVector(_with(env_threads=1), 4, seed=6)
    vec.reset()
    actions = np.random.default_rng(2).integers(4, size=(1000, 4))
    vec.step(actions[0])
    t = time.perf_counter()
    for a in actions:
        vec.step(a)
    dt = time.perf_counter() - t
    with capsys.disabled():
        print(f"\nAtariVector breakout k=4, 1 thread: {len(actions) / dt:.0f} vector steps/s, "
              f"{4 * len(actions) / dt:.0f} env steps/s")
    vec.close()


def test_atari_life_loss_cuts_bootstrap_and_fires_again():
    from mpirl.config import EnvConfig
    from mpirl.envs.vector import make_vector
    envs = make_vector(EnvConfig(id="ALE/Breakout-v5", envs_per_actor=2), seed=0)
    envs.reset()
    rng = np.random.default_rng(0)
    lost = fired = 0
    for _ in range(600):
        chosen = rng.integers(0, 2, 2) * 2  # NOOP or RIGHT only: never FIRE by choice
        executed = envs.forced(chosen)
        fired += int((executed == 1).sum())
        step = envs.step(executed)
        assert not (step.life_lost & (step.terminated | step.truncated)).any()  # a game over is not a life loss
        lost += int(step.life_lost.sum())
        if step.life_lost.any():
            assert (envs.forced(np.zeros(2, np.int64))[step.life_lost] == 1).all()  # FIRE comes next
    assert lost > 0 and fired == lost - int(envs.fire_next.any())  # each lost life, then exactly one FIRE
    off = make_vector(EnvConfig(id="ALE/Breakout-v5", terminal_on_life_loss=False, fire_on_life_loss=False), 0)
    off.reset()
    assert off.step(np.zeros(1, np.int64)).life_lost is None and off.fire is None


# --------------------------------------------------------------------------- images and MinAtar
class Pictures(gym.Env):
    """A Gymnasium env with channels-last uint8 images whose pixel (y, x, c) is 10 c + the step count."""

    def __init__(self, shape=(12, 9, 3)):
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def _obs(self):
        return np.broadcast_to((10 * np.arange(self.observation_space.shape[2]) + self.t).astype(np.uint8),
                               self.observation_space.shape).copy()

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= 5, False, {}


gym.register("mpirl-test/Pictures-v0", entry_point=Pictures)


def test_channels_last_images_reach_the_network_channels_first():
    cfg = EnvConfig(id="mpirl-test/Pictures-v0", envs_per_actor=2)
    assert env_spaces(cfg) == ((3, 12, 9), np.dtype(np.uint8), 2)
    vec = make_vector(cfg, seed=0)
    obs = vec.reset()
    assert obs.shape == (2, 3, 12, 9) and obs.flags.c_contiguous
    res = vec.step(np.zeros(2, np.int64))
    check_step_result(vec, res)
    np.testing.assert_array_equal(res.obs[:, :, 4, 7], [[1, 11, 21], [1, 11, 21]])  # channel c holds 10 c + t
    first = EnvConfig(id="mpirl-test/Pictures-v0", channels="first")  # taken as it is when told
    assert env_spaces(first) == ((12, 9, 3), np.dtype(np.uint8), 2)


@pytest.mark.parametrize("shape, last", [((10, 10, 4), True), ((10, 10, 10), True), ((210, 160, 3), True),
                                         ((84, 84, 4), True), ((4, 84, 84), False), ((3, 64, 64), False),
                                         ((7,), False), ((5, 5), False)])
def test_which_axis_holds_the_channels(shape, last):
    from mpirl.envs.images import channels_last
    assert channels_last(shape) is last
    assert channels_last(shape, "first") is False
    assert channels_last(shape, "last") is (len(shape) == 3)


@pytest.mark.parametrize("game, channels, actions", [("Breakout", 4, 3), ("SpaceInvaders", 6, 4), ("Asterix", 4, 5),
                                                     ("Seaquest", 10, 6), ("Freeway", 7, 3)])
def test_minatar_games_are_registered_by_mpirl_and_keep_their_boolean_planes(game, channels, actions):
    cfg = EnvConfig(id=f"MinAtar/{game}-v1", envs_per_actor=2)
    assert env_spaces(cfg) == ((channels, 10, 10), np.dtype(bool), actions)
    vec = make_vector(cfg, seed=3)
    obs = vec.reset()
    assert obs.shape == (2, channels, 10, 10) and obs.dtype == np.bool_ and obs.any()
    _, res, _ = run_until_episode_end(vec, np.random.default_rng(0), 100_000)
    check_step_result(vec, res)
    raw = vec.envs[0].unwrapped.game.state()  # the game's own (10, 10, C) planes, as the actor got them
    np.testing.assert_array_equal(res.obs[0], np.moveaxis(raw, -1, 0))


def test_minatar_through_its_module_prefix_and_unknown_games_are_refused():
    assert env_spaces(EnvConfig(id="minatar.gym:MinAtar/Breakout-v1"))[0] == (4, 10, 10)
    with pytest.raises(ConfigError, match=r"env\.id: unknown environment 'MinAtar/Brekout-v1'; "
                                          r"did you mean MinAtar/Breakout-v1"):
        env_spaces(EnvConfig(id="MinAtar/Brekout-v1"))
