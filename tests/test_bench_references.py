"""The benchmarks that set ours beside the reference libraries that live in venvs of their own (RLlib's and Sample
Factory's, made by the bench on first use and kept: :mod:`mpirl.bench.reference_venv`), and the MinAtar wrapper
those libraries play through. A file of their own, apart from test_bench.py: the suite's workers take whole files,
and together the two were the longest chain one worker had to run.

No timing is asserted: see test_bench.py.
"""

import numpy as np
import pytest


@pytest.mark.mpi
def test_impala_bench_runs_ours_and_the_references_each_in_its_venv_and_reports_a_target_never_reached():
    """Ours, SB3's PPO, RLlib's APPO and Sample Factory's APPO (the last two in the venvs the bench makes for them on
    first use) each run a seed with a budget too small to average 475: every row holds one value per implementation,
    no verdict on the target, and every implementation collected env steps at a positive rate."""
    from mpirl.bench import impala
    refs = ("SB3 PPO (zoo)", "RLlib APPO", "Sample Factory APPO")
    rows = impala.run(reps=1, budget=3000, wall=60, references=refs, breakout_wall=0)  # Breakout: the next test
    trained = ("RLlib APPO", "Sample Factory APPO")  # whose learner's count the bench reads
    assert [r.name for r in rows] == [name for ref in refs for name in (
        f"solve CartPole-v1 to 475 vs {ref} (wall time)", f"solve CartPole-v1 to 475 vs {ref} (env steps)",
        f"env steps/s collected on the way vs {ref}", *([f"learner env steps/s trained vs {ref}"] * (ref in trained)))]
    for r in rows:
        assert set(r.values) == {"mpirl IMPALA 4 ranks", r.reference} and all(len(v) == 1 for v in r.values.values())
    for crossing in (r for r in rows if "(wall time)" in r.name):  # 3,000 env steps cannot average 475: no verdict
        assert crossing.values[crossing.reference] == [float("inf")] and "not reached" in crossing.note
        assert not crossing.met
    for rate in (r for r in rows if "env steps/s" in r.name):
        assert all(0 < v[0] < float("inf") for v in rate.values.values()), (rate.name, rate.values)


@pytest.mark.mpi
def test_impala_bench_breakout_rows_set_ours_beside_sample_factory_on_minatar_breakout():
    """The Breakout throughput rows, one short seed, ours and Sample Factory's APPO (in its venv): each collected
    env steps and its learner trained some, and each row has a ratio. Each side runs to 20,000 env steps, an event,
    not a time: a wall of 6 s (what this test gave before) left our learner untrained when a loaded machine (a load
    of 10 on 2 cores) spent it on the ranks' start-up, which our job's wall counts. Here, idle, ours played 1.2 s
    and trained 19,200 env steps, Sample Factory 4.8 s and 77,824 (4 epochs counted); the wall of 120 s is the
    deadline."""
    from mpirl.bench import impala
    rows = impala.breakout(reps=1, wall=120, references=("Sample Factory APPO",), budget=20_000)
    assert [r.name for r in rows] == ["MinAtar Breakout env steps/s collected vs Sample Factory APPO",
                                      "MinAtar Breakout learner env steps/s trained vs Sample Factory APPO"]
    for r in rows:
        assert set(r.values) == {"mpirl IMPALA 4 ranks", "Sample Factory APPO"}, r.values
        assert all(len(v) == 1 and 0 < v[0] < float("inf") for v in r.values.values()), (r.name, r.values)
        assert 0 < r.ratio < float("inf") and r.ratio == pytest.approx(r.median(r.ours) / r.median(r.reference))


def test_reference_minatar_env_plays_minatars_own_breakout_step_for_step():
    """The Gymnasium wrapper the reference libraries play MinAtar Breakout through (``refs/minatar_env.py``) is
    MinAtar's ``MinAtar/Breakout-v1`` (mpirl's game): same seed, same actions -> same planes (as float32), rewards
    and ends; 3 actions, no truncation."""
    import gymnasium as gym
    from mpirl.bench.refs import minatar_env
    from mpirl.envs.factory import _register_minatar
    _register_minatar("MinAtar/Breakout-v1")
    ours, theirs = minatar_env.make("MinAtar/Breakout-v1"), gym.make("MinAtar/Breakout-v1")
    assert minatar_env.game_of("MinAtar/SpaceInvaders-v1") == "space_invaders"
    assert ours.observation_space.shape == (10, 10, 4) and ours.observation_space.dtype == np.float32
    assert ours.action_space.n == theirs.action_space.n == 3
    rng = np.random.default_rng(0)
    returns = []
    for episode in range(200):
        seed = 7 if episode == 0 else None
        (a, _), (b, _) = ours.reset(seed=seed), theirs.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            assert a.dtype == np.float32 and np.array_equal(a, b.astype(np.float32))
            action = int(rng.integers(3))
            a, reward, terminated, truncated, _ = ours.step(action)
            b, reward_b, terminated_b, truncated_b, _ = theirs.step(action)
            assert (reward, terminated, truncated) == (reward_b, terminated_b, truncated_b) and not truncated
            total, done = total + reward, terminated
        returns.append(total)
    assert 0.1 < np.mean(returns) < 1.5  # random play scores little: about 0.4 a game with 3 actions
