"""Multi-agent envs (no MPI): predator–prey capture rules, PettingZoo's API and seed tests, TeamEnv."""

from __future__ import annotations

import functools
import sys

import numpy as np
import pytest

from gymnasium import spaces
from pettingzoo.test import parallel_api_test, parallel_seed_test
from pettingzoo.utils.env import ParallelEnv

from mpirl.envs.marl_install import INSTALL_HINT, MarlDependencyError, install_hint
from mpirl.envs.pettingzoo import (
    TeamEnv, TeamStep, check_team_env, describe, make_team_env,
    team_env_spaces,
)
from mpirl.envs.predator_prey import CATCH, DOWN, LEFT, RIGHT, STAY, UP, PredatorPrey

PURSUIT = "pettingzoo.sisl.pursuit_v5"


def placed(predators, prey, **kwargs):
    """A still predator–prey env (prey do not move) with hand-placed entities, after reset."""
    kwargs = {"grid": 5, "n_predators": len(predators), "n_prey": max(len(prey), 1), "prey_moves": False,
              **kwargs}
    env = PredatorPrey(**kwargs)
    obs, infos = env.reset(seed=0, options={"predators": predators, "prey": prey})
    return env, obs, infos


def act(env, **moves):
    """Step with ``predator_i=action`` keywords; everyone else stays."""
    actions = {a: STAY for a in env.agents}
    actions.update({f"predator_{k.split('_')[1]}": v for k, v in moves.items()})
    return env.step(actions)


# ----- predator–prey rules --------------------------------------------------------------------


def test_two_adjacent_catchers_capture_and_leave():
    env, _, infos = placed([(2, 1), (2, 3), (0, 4)], [(2, 2), (4, 0)])
    assert infos["predator_0"]["action_mask"][CATCH] == 1 and infos["predator_1"]["action_mask"][CATCH] == 1
    assert infos["predator_2"]["action_mask"][CATCH] == 0
    obs, rew, term, trunc, infos = act(env, p_0=CATCH, p_1=CATCH)
    assert rew == dict.fromkeys(env.possible_agents, 10.0)
    assert not any(term.values()) and not any(trunc.values())
    assert env.agents == env.possible_agents  # frozen agents stay in the episode
    np.testing.assert_array_equal(env.predator_positions, [[-1, -1], [-1, -1], [0, 4]])
    np.testing.assert_array_equal(env.prey_positions, [[-1, -1], [4, 0]])
    assert (env.episode_captures, env.episode_lone_catches) == (1, 0)
    for agent in ("predator_0", "predator_1"):  # frozen: zero observation, only stay legal
        assert not obs[agent].any()
        np.testing.assert_array_equal(infos[agent]["action_mask"], [0, 0, 0, 0, 1, 0])
        np.testing.assert_array_equal(env.action_mask(agent), [0, 0, 0, 0, 1, 0])
    assert obs["predator_2"].any()
    # a frozen agent's actions do nothing
    obs, rew, *_ = act(env, p_0=RIGHT, p_1=CATCH)
    assert rew["predator_0"] == 0.0 and env.episode_lone_catches == 0
    np.testing.assert_array_equal(env.predator_positions[:2], [[-1, -1], [-1, -1]])


@pytest.mark.parametrize("punishment", [0.0, -1.5])
def test_lone_catch_costs_punishment_and_nobody_leaves(punishment):
    env, *_ = placed([(2, 1), (0, 0)], [(2, 2)], punishment=punishment)
    before = env.predator_positions.copy()
    _, rew, term, _, _ = act(env, p_0=CATCH)
    assert rew == dict.fromkeys(env.possible_agents, punishment)
    assert not any(term.values())
    np.testing.assert_array_equal(env.predator_positions, before)
    np.testing.assert_array_equal(env.prey_positions, [[2, 2]])
    assert (env.episode_captures, env.episode_lone_catches) == (0, 1)
    # two catchers on two different prey are two lone catches
    env, *_ = placed([(0, 0), (4, 4)], [(0, 1), (4, 3)], punishment=punishment)
    _, rew, *_ = act(env, p_0=CATCH, p_1=CATCH)
    assert rew["predator_0"] == 2 * punishment and env.episode_lone_catches == 2


def test_catch_targets_the_first_prey_in_up_down_left_right_order():
    # predator_0 has prey up (1, 2) and right (2, 3): it targets the one up, as predator_1 (above it) does
    env, *_ = placed([(2, 2), (0, 2), (4, 4)], [(1, 2), (2, 3)], punishment=-1.5)
    _, rew, *_ = act(env, p_0=CATCH, p_1=CATCH)
    assert rew["predator_0"] == 10.0
    np.testing.assert_array_equal(env.prey_positions, [[-1, -1], [2, 3]])
    # three catchers on one prey: one capture, all three leave
    env, *_ = placed([(1, 2), (3, 2), (2, 1), (0, 0)], [(2, 2), (4, 4)])
    _, rew, *_ = act(env, p_0=CATCH, p_1=CATCH, p_2=CATCH)
    assert rew["predator_0"] == 10.0 and env.episode_captures == 1
    assert (env.predator_positions[:3] == -1).all()


def test_catch_without_adjacent_prey_is_illegal_and_does_nothing():
    env, _, infos = placed([(0, 0), (4, 4)], [(2, 2)], punishment=-1.5)
    assert infos["predator_0"]["action_mask"][CATCH] == 0
    _, rew, *_ = act(env, p_0=CATCH, p_1=CATCH)
    assert rew["predator_0"] == 0.0 and env.episode_lone_catches == 0
    # diagonal is not adjacent
    env, _, infos = placed([(1, 1), (4, 4)], [(2, 2)], punishment=-1.5)
    assert infos["predator_0"]["action_mask"][CATCH] == 0


def test_moves_into_occupied_cells_or_off_the_grid_fail():
    env, _, infos = placed([(0, 0), (0, 1), (4, 4)], [(1, 0)])
    np.testing.assert_array_equal(infos["predator_0"]["action_mask"], [0, 0, 0, 0, 1, 1])  # up/left off, right/down full
    for action in (UP, DOWN, LEFT, RIGHT):
        act(env, p_0=action)
        np.testing.assert_array_equal(env.predator_positions[0], [0, 0])
    act(env, p_2=DOWN)
    np.testing.assert_array_equal(env.predator_positions[2], [4, 4])
    act(env, p_2=UP)
    np.testing.assert_array_equal(env.predator_positions[2], [3, 4])
    # a predator cannot follow into a cell that another one leaves in the same step
    env, *_ = placed([(2, 0), (2, 1), (4, 4)], [(0, 0)])
    act(env, p_0=RIGHT, p_1=RIGHT)
    np.testing.assert_array_equal(env.predator_positions[:2], [[2, 0], [2, 2]])


def test_contested_cell_goes_to_one_mover_reproducibly():
    winners = []
    for seed in range(20):
        env = PredatorPrey(grid=5, n_predators=3, n_prey=1, prey_moves=False)
        env.reset(seed=seed, options={"predators": [(2, 1), (2, 3), (4, 4)], "prey": [(0, 0)]})
        act(env, p_0=RIGHT, p_1=LEFT)
        pos = env.predator_positions
        moved = [i for i in (0, 1) if tuple(pos[i]) == (2, 2)]
        assert len(moved) == 1
        assert tuple(pos[1 - moved[0]]) == ((2, 1), (2, 3))[1 - moved[0]]
        winners.append(moved[0])
        again = PredatorPrey(grid=5, n_predators=3, n_prey=1, prey_moves=False)
        again.reset(seed=seed, options={"predators": [(2, 1), (2, 3), (4, 4)], "prey": [(0, 0)]})
        act(again, p_0=RIGHT, p_1=LEFT)
        np.testing.assert_array_equal(again.predator_positions, pos)
    assert set(winners) == {0, 1}  # a random winner, not always the same agent


def test_episode_terminates_when_no_prey_left():
    env, *_ = placed([(2, 1), (2, 3), (0, 0)], [(2, 2)])
    obs, rew, term, trunc, _ = act(env, p_0=CATCH, p_1=CATCH)
    assert rew["predator_2"] == 10.0
    assert all(term.values()) and not any(trunc.values()) and set(term) == set(env.possible_agents)
    assert env.agents == []
    with pytest.raises(RuntimeError, match="reset"):
        env.step({})


def test_episode_terminates_when_no_predator_left():
    env, *_ = placed([(2, 1), (2, 3)], [(2, 2), (0, 0)])
    _, _, term, trunc, _ = act(env, p_0=CATCH, p_1=CATCH)
    assert all(term.values()) and not any(trunc.values()) and env.agents == []


def test_truncation_at_max_steps():
    env, *_ = placed([(0, 0), (4, 4)], [(2, 2)], max_steps=3)
    for _ in range(2):
        _, _, term, trunc, _ = act(env)
        assert not any(term.values()) and not any(trunc.values())
    _, _, term, trunc, _ = act(env)
    assert all(trunc.values()) and not any(term.values()) and env.agents == []
    assert env.episode_steps == 3


def test_observation_and_state_channels():
    env, obs, _ = placed([(0, 0), (0, 2)], [(1, 0)])
    o = obs["predator_0"]  # 5x5 centred on (0, 0): rows/cols -2..2
    assert o.shape == (5, 5, 3) and o.dtype == np.uint8
    assert o[2, 2, 0] == 1 and o[2, 4, 0] == 1  # itself and predator_1 two cells right
    assert o[3, 2, 1] == 1 and o[:, :, 1].sum() == 1  # the prey one row down
    assert (o[:2, :, 2] == 1).all() and (o[:, :2, 2] == 1).all() and o[2:, 2:, 2].sum() == 0  # outside
    assert env.observation_space("predator_0").contains(o)
    s = env.state()
    assert s.shape == (5, 5, 3) and s.dtype == np.uint8 and env.state_space.contains(s)
    assert s[0, 0, 0] == s[0, 2, 0] == 1 and s[:, :, 0].sum() == 2
    assert s[1, 0, 1] == 1 and s[:, :, 1].sum() == 1
    zone = {(int(r), int(c)) for r, c in zip(*np.nonzero(s[:, :, 2]))}
    assert zone == {(0, 0), (2, 0), (1, 1)}  # cells next to the prey, on the grid


def test_random_play_keeps_entities_on_distinct_cells_and_prey_step_at_most_one():
    env = PredatorPrey(grid=6, n_predators=8, n_prey=8)
    env.reset(seed=3)
    rng = np.random.default_rng(3)
    for _ in range(300):
        prey_before = env.prey_positions.copy()
        masks = env.action_masks()
        acts = (rng.random(masks.shape) * masks).argmax(axis=1)
        env.step(dict(zip(env.agents, acts.tolist())))
        pos = np.concatenate([env.predator_positions, env.prey_positions])
        on = pos[(pos >= 0).all(axis=1)]
        assert ((on >= 0) & (on < 6)).all()
        assert len({tuple(p) for p in on}) == len(on)
        live = (prey_before >= 0).all(axis=1) & (env.prey_positions >= 0).all(axis=1)
        assert (np.abs(env.prey_positions[live] - prey_before[live]).sum(axis=1) <= 1).all()
        if not env.agents:
            env.reset()


def test_same_seed_same_episode_other_seed_differs():
    def run(seed):
        env = PredatorPrey(n_predators=8)
        env.reset(seed=seed)
        rng = np.random.default_rng(0)
        trace = []
        for _ in range(50):
            acts = (rng.random((8, 6)) * env.action_masks()).argmax(axis=1)
            env.step(dict(zip(env.agents, acts.tolist())))
            trace.append(np.concatenate([env.predator_positions, env.prey_positions]))
        return np.array(trace)
    np.testing.assert_array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="punishment"):
        PredatorPrey(punishment=1.0)
    with pytest.raises(ValueError, match="do not fit"):
        PredatorPrey(grid=3, n_predators=5)
    with pytest.raises(ValueError, match="n_predators"):
        PredatorPrey(n_predators=1)
    env = PredatorPrey(grid=5, n_predators=2)
    with pytest.raises(ValueError, match="two entities"):
        env.reset(options={"predators": [(0, 0), (0, 0)], "prey": []})
    env.reset(seed=0)
    with pytest.raises(ValueError, match="outside"):
        env.step({"predator_0": 6})


# ----- PettingZoo's own tests -----------------------------------------------------------------


@pytest.mark.parametrize("n", [8, 32])
def test_predator_prey_passes_pettingzoo_api_and_seed_tests(n):
    parallel_api_test(PredatorPrey(n_predators=n), num_cycles=1000)
    parallel_seed_test(functools.partial(PredatorPrey, n_predators=n))
    punishing = PredatorPrey(n_predators=n, punishment=-1.5, max_steps=50)
    parallel_api_test(punishing, num_cycles=1000)


def test_pursuit_passes_pettingzoo_api_and_seed_tests():
    parallel_api_test(make_team_env(PURSUIT, max_cycles=20).env, num_cycles=1000)
    parallel_seed_test(lambda: make_team_env(PURSUIT, max_cycles=20).env)


def test_simple_spread_passes_pettingzoo_api_and_seed_tests():
    parallel_api_test(make_team_env("mpe2.simple_spread_v3").env, num_cycles=1000)
    parallel_seed_test(lambda: make_team_env("mpe2.simple_spread_v3").env)


# ----- TeamEnv --------------------------------------------------------------------------------


def test_team_reward_same_is_counted_once():
    team = TeamEnv(PredatorPrey(grid=5, n_predators=3, n_prey=2, prey_moves=False), reward="same")
    obs, mask, state = team.reset(seed=0, options={"predators": [(2, 1), (2, 3), (0, 0)],
                                                    "prey": [(2, 2), (4, 4)]})
    assert obs.shape == (3, 5, 5, 3) and obs.dtype == np.uint8
    assert mask.shape == (3, 6) and mask.dtype == np.bool_ and mask[0, CATCH] and not mask[2, CATCH]
    assert state.shape == (5, 5, 3) and state.dtype == np.uint8
    res = team.step(np.array([CATCH, CATCH, STAY]))
    assert isinstance(res, TeamStep)
    assert res.reward == 10.0 and not res.terminated and not res.truncated
    assert not res.obs[:2].any() and res.obs[2].any()
    np.testing.assert_array_equal(res.mask[:2], [[0, 0, 0, 0, 1, 0]] * 2)
    assert team.noop == STAY
    # team reward summed would be 30: "sum" counts every agent
    summed = TeamEnv(PredatorPrey(grid=5, n_predators=3, n_prey=2, prey_moves=False), reward="sum")
    summed.reset(seed=0, options={"predators": [(2, 1), (2, 3), (0, 0)], "prey": [(2, 2), (4, 4)]})
    assert summed.step(np.array([CATCH, CATCH, STAY])).reward == 30.0


def test_team_env_episode_end_info_and_flags():
    team = make_team_env("predator_prey", seed=5, grid=5, n_predators=2, n_prey=1, max_steps=4)
    obs, mask, state = team.reset()
    for _ in range(4):
        res = team.step(np.full(2, STAY))
    assert res.truncated and not res.terminated
    assert res.info["episode_length"] == 4 and {"captures", "lone_catches"} <= set(res.info)
    with pytest.raises(RuntimeError, match="reset"):
        team.step(np.full(2, STAY))
    again = make_team_env("predator_prey", seed=5, grid=5, n_predators=2, n_prey=1, max_steps=4)
    np.testing.assert_array_equal(again.reset()[0], obs)  # the make-time seed seeds the first reset


def test_team_env_on_pursuit_shapes_mean_reward_and_truncation():
    team = make_team_env(PURSUIT, seed=0, max_cycles=15)
    sp = team.spaces
    assert (sp.n_agents, sp.obs_shape, sp.n_actions, sp.state_shape) == (8, (7, 7, 3), 5, (16, 16, 3))
    assert team_env_spaces(PURSUIT, max_cycles=15) == sp
    raw = []
    inner_step = team.env.step

    def spy(actions):
        out = inner_step(actions)
        raw.append(dict(out[1]))
        return out
    team.env.step = spy
    obs, mask, state = team.reset()
    assert obs.shape == (8, 7, 7, 3) and obs.dtype == np.float32 and mask.all() and state.shape == (16, 16, 3)
    rng = np.random.default_rng(0)
    for t in range(15):
        res = team.step(rng.integers(5, size=8))
        values = list(raw[-1].values())
        assert res.reward == pytest.approx(np.mean(values))
        assert len(set(values)) == 1  # shared_reward=True: every pursuer gets the same number
        if t < 14:
            assert not res.terminated and not res.truncated
    assert res.truncated and not res.terminated  # the time limit is a truncation
    assert res.info["episode_length"] == 15


class _Leaver(ParallelEnv):
    """Two agents; ``agent_1`` leaves after the first step; the episode is truncated at step 3."""

    metadata = {"name": "leaver"}

    def __init__(self, masks_in="info"):
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents = []
        self._obs = spaces.Box(0, 1, (2,), np.float32)
        self._act = spaces.Discrete(3)
        self.masks_in = masks_in
        self.seen_actions = []

    def observation_space(self, agent):
        return self._obs

    def action_space(self, agent):
        return self._act

    def _out(self):
        obs = {a: np.ones(2, np.float32) for a in self.agents}
        infos = {a: ({"action_mask": np.array([0, 1, 1], np.int8)} if self.masks_in == "info" else {})
                 for a in self.agents}
        return obs, infos

    def reset(self, seed=None, options=None):
        self.agents, self.t = self.possible_agents[:], 0
        return self._out()

    def step(self, actions):
        self.seen_actions.append(dict(actions))
        self.t += 1
        done = dict.fromkeys(self.agents, False)
        trunc = dict.fromkeys(self.agents, self.t >= 3)
        if self.t == 1:
            done["agent_1"] = True
        rew = dict.fromkeys(self.agents, 1.0)
        self.agents = [a for a in self.agents if not done[a] and not trunc[a]]
        obs, infos = self._out()
        return obs, rew, done, trunc, {a: infos.get(a, {}) for a in done}


def test_team_env_missing_agents_get_zero_obs_and_noop_mask():
    team = TeamEnv(_Leaver(), reward="mean", noop=0)
    obs, mask, _ = team.reset()
    np.testing.assert_array_equal(mask, [[0, 1, 1], [0, 1, 1]])  # from infos
    res = team.step(np.array([1, 2]))
    assert res.reward == 1.0 and not res.terminated and not res.truncated
    res = team.step(np.array([1, 2]))
    assert team.env.seen_actions[-1] == {"agent_0": 1}  # the agent that left gets no action
    np.testing.assert_array_equal(res.obs, [[1, 1], [0, 0]])
    np.testing.assert_array_equal(res.mask[1], [1, 0, 0])  # only the no-op
    assert res.state.shape == (4,) and team.spaces.state_source == "observations"
    np.testing.assert_array_equal(res.state, [1, 1, 0, 0])
    res = team.step(np.array([1, 2]))
    assert res.truncated and not res.terminated
    # no no-op named and no masks anywhere: all legal
    team = TeamEnv(_Leaver(masks_in="none"), reward="sum")
    _, mask, _ = team.reset()
    assert mask.all()
    team.step(np.array([0, 0]))
    assert team.step(np.array([0, 0])).mask.all()


def test_team_env_same_refuses_unequal_rewards():
    class Unequal(_Leaver):
        def step(self, actions):
            out = super().step(actions)
            return (out[0], {"agent_0": 1.0, "agent_1": 2.0}, *out[2:])
    team = TeamEnv(Unequal(), reward="same")
    team.reset()
    with pytest.raises(ValueError, match="different rewards"):
        team.step(np.array([1, 1]))


# ----- refusals and the factory ---------------------------------------------------------------


class _TwoKinds(ParallelEnv):
    metadata = {"name": "two_kinds"}

    def __init__(self, obs=((2,), (3,)), act=(spaces.Discrete(2), spaces.Discrete(2))):
        self.possible_agents = ["scout", "tank"]
        self.agents = []
        self._obs = {a: spaces.Box(0, 1, shape, np.float32) if isinstance(shape, tuple) else shape
                     for a, shape in zip(self.possible_agents, obs)}
        self._act = dict(zip(self.possible_agents, act))

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return self._act[agent]


def test_check_team_env_refusals():
    import pettingzoo
    with pytest.raises(ValueError, match=r"AEC.*parallel_env\(\)"):
        check_team_env(pettingzoo.make("aec", "sisl/pursuit-v5", max_cycles=5))
    with pytest.raises(ValueError, match="heterogeneous agents: scout .* tank"):
        check_team_env(_TwoKinds())
    with pytest.raises(ValueError, match="Discrete"):
        check_team_env(_TwoKinds(obs=((2,), (2,)), act=(spaces.Box(-1, 1, (2,)),) * 2))
    with pytest.raises(ValueError, match="Box"):
        check_team_env(_TwoKinds(obs=(spaces.Discrete(4), spaces.Discrete(4))))
    with pytest.raises(ValueError, match="not a PettingZoo ParallelEnv"):
        check_team_env(object())
    with pytest.raises(ValueError, match="heterogeneous"):
        TeamEnv(_TwoKinds())
    check_team_env(PredatorPrey())
    assert describe(PredatorPrey(n_predators=16)).n_agents == 16


def test_check_team_env_refuses_continuous_mpe2():
    from mpe2 import simple_spread_v3
    with pytest.raises(ValueError, match="Discrete.*continuous_actions=False"):
        check_team_env(simple_spread_v3.parallel_env(continuous_actions=True))
    with pytest.raises(ValueError, match="Discrete"):
        make_team_env("mpe2.simple_spread_v3", continuous_actions=True)
    team = make_team_env("mpe2.simple_spread_v3", seed=0, N=3)
    obs, mask, state = team.reset()
    assert obs.shape == (3, 18) and state.shape == (54,) and team.noop == 0


def test_make_team_env_unknown_id_and_bad_settings():
    with pytest.raises(ValueError, match="predator_prey.*pursuit_v5"):
        make_team_env("pong", seed=0)
    with pytest.raises(ValueError, match="bad settings"):
        make_team_env("predator_prey", seed=0, n_wolves=3)
    with pytest.raises(ValueError, match="punishment"):
        team_env_spaces("predator_prey", punishment=2.0)
    sp = team_env_spaces("predator_prey", n_predators=32, grid=10)
    assert (sp.n_agents, sp.obs_shape, sp.n_actions, sp.state_shape) == (32, (5, 5, 3), 6, (10, 10, 3))


def test_missing_package_names_the_marl_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "mpe2" or m.startswith("mpe2.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mpe2", None)  # import mpe2 now fails as if not installed
    with pytest.raises(ModuleNotFoundError, match=INSTALL_HINT.replace("[", r"\[").replace("]", r"\]")) as err:
        make_team_env("mpe2.simple_spread_v3", seed=0)
    assert isinstance(err.value, MarlDependencyError)


def test_a_missing_family_package_names_the_install_that_provides_it(monkeypatch):
    """pettingzoo.atari needs multi_agent_ale_py, which the marl extra does not install: the message names
    PettingZoo's atari extra (which lists it), and the marl extra only for PettingZoo and mpe2 themselves."""
    from importlib.metadata import requires

    atari = [r for r in requires("pettingzoo") if 'extra == "atari"' in r]
    assert any(r.startswith("multi_agent_ale_py") for r in atari)  # what the hint relies on
    assert install_hint("multi_agent_ale_py", "pettingzoo.atari.pong_v3") == "pip install 'pettingzoo[atari]'"
    assert install_hint("mpe2.simple_spread_v3", "mpe2.simple_spread_v3") == INSTALL_HINT
    assert install_hint("pettingzoo", "pettingzoo.sisl.pursuit_v5") == INSTALL_HINT
    assert install_hint("pymunk", "pettingzoo.sisl.pursuit_v5") == "pip install 'pettingzoo[sisl]'"
    assert install_hint("zzz_nowhere", "mpe2.simple_v3").startswith("pip install zzz_nowhere")
    monkeypatch.setitem(sys.modules, "multi_agent_ale_py", None)  # as if not installed, wherever this runs
    with pytest.raises(MarlDependencyError, match=r"multi_agent_ale_py.*pip install 'pettingzoo\[atari\]'$"):
        make_team_env("pettingzoo.atari.pong_v3", seed=0)


@pytest.mark.parametrize("env_id, kwargs, limit", [
    ("predator_prey", {}, ("max_steps", 200)),
    ("predator_prey", {"max_steps": 17}, ("max_steps", 17)),
    ("pettingzoo.sisl.pursuit_v5", {}, ("max_cycles", 500)),
    ("pettingzoo.sisl.pursuit_v5", {"max_cycles": 60}, ("max_cycles", 60)),
    ("mpe2.simple_spread_v3", {}, ("max_cycles", 25)),
    ("mpe2.simple_v3", {}, ("max_cycles", 25)),
    ("mpe2.simple_reference_v3", {"max_cycles": 40}, ("max_cycles", 40)),
])
def test_an_envs_own_episode_limit_is_read_off_the_env(env_id, kwargs, limit):
    from mpirl.envs.pettingzoo import own_episode_limit
    team = make_team_env(env_id, seed=0, **kwargs)
    try:
        assert own_episode_limit(team) == limit
    finally:
        team.close()


def test_an_env_that_keeps_no_limit_says_so():
    from endless_team_env import Endless

    from mpirl.envs.pettingzoo import own_episode_limit
    assert own_episode_limit(TeamEnv(Endless())) is None
