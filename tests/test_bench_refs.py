"""The reference scripts' bookkeeping (``mpirl/bench/refs``), without the libraries: what they read from Sample
Factory's log, how RLlib's learner share is worked out, and what :mod:`episode_file` records of an Atari-like game
(whole games, unclipped returns, agent steps) and of the steps taken. Fast: no library is run."""

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

REFS = Path(__file__).resolve().parents[1] / "mpirl" / "bench" / "refs"

# An excerpt of a real Sample Factory 2.1.1 log (``sf_run.py 1 10000000 30 inf ALE/Pong-v5``, its colours kept):
# the settings line and the stop line are sf_run's own, the rest Sample Factory's.
ESC = "\x1b"
SF_LOG = f"""{ESC}[37m{ESC}[1m[2026-11-28 01:05:29,720][08186] mpirl: counts: num_epochs=4 env_frameskip=4 \
summaries_use_frameskip=True{ESC}[0m
{ESC}[36m[2026-11-28 01:05:29,749][08186] Experiment dir /tmp/mpirl-sf-eayixdk2/sf/run already exists!{ESC}[0m
{ESC}[37m{ESC}[1m[2026-11-28 01:06:33,614][08186] All inference workers are ready! Signal rollout workers to start!\
{ESC}[0m
{ESC}[36m[2026-11-28 01:06:34,783][08186] Fps is (10 sec: nan, 60 sec: nan, 300 sec: nan). Total num frames: 0. \
Throughput: 0: nan. Samples: 0. Policy #0 lag: (min: -1.0, avg: -1.0, max: -1.0){ESC}[0m
{ESC}[36m[2026-11-28 01:07:04,764][08186] Fps is (10 sec: 0.0, 60 sec: 0.0, 300 sec: 0.0). Total num frames: 0. \
Throughput: 0: 68.8. Samples: 2064. Policy #0 lag: (min: -1.0, avg: -1.0, max: -1.0){ESC}[0m
{ESC}[36m[2026-11-28 01:07:09,763][08186] Fps is (10 sec: 409.6, 60 sec: 117.1, 300 sec: 117.1). Total num frames: \
4096. Throughput: 0: 59.7. Samples: 2088. Policy #0 lag: (min: 0.0, avg: 0.0, max: 0.0){ESC}[0m
{ESC}[37m{ESC}[1m[2026-11-28 01:07:12,364][08186] mpirl: stop asked at 1795828032.364094; learner env steps 4096\
{ESC}[0m
{ESC}[36m[2026-11-28 01:07:12,378][08245] Stopping Batcher_0...{ESC}[0m
{ESC}[36m[2026-11-28 01:07:31,811][08186] Component LearnerWorker_p0 stopped!{ESC}[0m
{ESC}[37m{ESC}[1m[2026-11-28 01:07:40,263][08186] InferenceWorker_p0-w0 profile tree view:
wait_policy: 0.0480
  wait_policy_total: 17.2550
update_model: 0.8763{ESC}[0m
{ESC}[37m{ESC}[1m[2026-11-28 01:07:40,263][08186] Learner 0 profile tree view:
misc: 0.0000, prepare_batch: 1.9179
train: 35.2435
  epoch_init: 0.0002, minibatch_init: 0.0192, losses_postprocess: 0.0055, kl_divergence: 0.0085, after_optimizer: 0.0157
  calculate_losses: 9.5177
  update: 25.6509
    clip: 0.1693{ESC}[0m
{ESC}[37m{ESC}[1m[2026-11-28 01:07:40,264][08186] RolloutWorker_w0 profile tree view:
wait_for_trajectories: 0.0007, enqueue_policy_requests: 2.5158, env_step: 11.2336, overhead: 0.5989{ESC}[0m
{ESC}[37m{ESC}[1m[2026-11-28 01:07:40,275][08186] Runner profile tree view:
main_loop: 117.0199{ESC}[0m
{ESC}[37m{ESC}[1m[2026-11-28 01:07:40,275][08186] Collected {{0: 8192}}, FPS: 70.0{ESC}[0m
"""


@pytest.fixture
def refs(monkeypatch):
    monkeypatch.syspath_prepend(str(REFS))  # as the scripts put their folder first, in their venvs
    for name in ("sf_run", "rllib_run", "episode_file", "ale_env"):
        sys.modules.pop(name, None)
    yield
    for name in ("sf_run", "rllib_run", "episode_file", "ale_env"):
        sys.modules.pop(name, None)


def test_sample_factory_log_gives_the_learners_counts_in_agent_steps_and_its_busy_share(refs):
    import sf_run
    origin = sf_run.when("2026-11-28 01:06:42,000")  # the first env step
    assert sf_run.per_agent_step(SF_LOG) == (4, 4)  # 4 epochs; its counts are frames, 4 an agent step
    assert sf_run.started_at(SF_LOG) == sf_run.when("2026-11-28 01:06:33,614")
    # Trained: the learner's count when the stop was asked (4,096 frames: 1,024 samples), each of 4 epochs counted,
    # not the 8,192 of its end (a batch it finished after the stop).
    trained, how = sf_run.trained(SF_LOG)
    assert trained == 4096 and "x num_epochs 4" in how and "when the stop was asked" in how
    # Each sample once at its last periodic report, in agent steps, and that report's seconds since the first step.
    steps, seconds = sf_run.learner_count(SF_LOG, origin)
    assert steps == 1024 and seconds == pytest.approx(27.763)
    # 35.2435 s in its update step over the 49.811 s from the first env step to the learner's stop.
    busy, note = sf_run.learner_busy(SF_LOG, origin)
    assert busy == pytest.approx(35.2435 / 49.811) and "'train'" in note
    # Without its stop line, its end; without timers (a child stopped from outside), no share and why.
    assert sf_run.trained(SF_LOG.replace("mpirl: stop asked", "-"))[0] == 8192
    cut = SF_LOG[:SF_LOG.index("Component LearnerWorker_p0")]
    assert sf_run.trained(cut.replace("mpirl: stop asked", "-"))[0] == 4096  # its last report
    assert sf_run.learner_busy(cut, origin)[0] is None and "no learner timers" in sf_run.learner_busy(cut, origin)[1]
    assert sf_run.per_agent_step(SF_LOG.replace("summaries_use_frameskip=True", "summaries_use_frameskip=False")) \
        == (4, 1)


def test_rllib_learner_update_seconds_and_batch_size(refs):
    from types import SimpleNamespace
    import rllib_run
    result = {"learners": {"__all_modules__": {"learner_thread_update_timer": 0.5}}}
    assert rllib_run.update_seconds(result) == 0.5
    assert rllib_run.update_seconds({"learners": {"__all_modules__": {"learner_thread_update_timer": float("nan")}}}) \
        is None and rllib_run.update_seconds({}) is None
    # IMPALA's rollout fragment of 50 on 8 games: 400 env steps a sample() call, 2 of them to reach 500, and a
    # bootstrap step a game a call (RLlib counted 816 a batch on Pong).
    cfg = SimpleNamespace(num_envs_per_env_runner=8, train_batch_size_per_learner=500,
                          get_rollout_fragment_length=lambda: 50)
    assert rllib_run.package_size(cfg) == 816


class LivesGame(gym.Env):
    """A game of 2 lives of 3 steps each, reward 2 a step, with ``ale.lives()`` as an ALE game has."""
    observation_space = gym.spaces.Box(0, 255, (2,), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.t = 0
        self.ale = self

    def lives(self):
        return 2 - self.t // 3

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(2, np.uint8), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.uint8), 2.0, self.t >= 6, False, {}


class LifeEpisodes(gym.Wrapper):
    """A lost life ends the episode the agent trains on; the game goes on (as the libraries' EpisodicLifeEnv)."""

    def __init__(self, env):
        super().__init__(env)
        self.lives, self.over = 0, True

    def reset(self, **kwargs):
        if self.over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, _, _, info = self.env.step(0)  # a step the agent did not take
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        lost, self.lives = 0 < lives < self.lives, lives
        return obs, reward, terminated or lost, truncated, info


def test_episode_file_records_whole_games_unclipped_and_counts_agent_steps(refs, tmp_path, monkeypatch):
    monkeypatch.setenv("MPIRL_EPISODES", str(tmp_path))
    import episode_file
    env = gym.wrappers.RecordEpisodeStatistics(LivesGame())  # beneath, as ale_env.make puts it
    env = gym.wrappers.ClipReward(LifeEpisodes(env), -1.0, 1.0)
    env = episode_file.EpisodeFile(env, games=True)
    env.reset(seed=0)
    agent_steps = 0
    for _ in range(4):  # 4 lives: 2 games
        done = False
        while not done:
            _, reward, terminated, truncated, _ = env.step(0)
            agent_steps += 1
            assert reward == 1.0  # clipped for training
            done = terminated or truncated
        env.reset()
    env.close()  # its count written now
    rows = episode_file.episodes(str(tmp_path))
    # The life-reset steps (one a lost life) are not the agent's: each game is 5 agent steps; its return is the
    # game's score, unclipped, the reset's step included (6 frames of 2).
    assert [(length, ret) for _, length, ret in rows] == [(5, 12.0), (5, 12.0)] and agent_steps == 10
    first, steps = episode_file.steps_taken(str(tmp_path))
    assert steps == 10 and first is not None and first <= rows[0][0]


def test_ale_env_makes_the_v5_game_one_frame_a_step_without_sticky_actions(refs):
    pytest.importorskip("ale_py")
    import ale_env
    env = ale_env.make("ALE/Pong-v5")
    spec = env.unwrapped.spec.kwargs if env.unwrapped.spec else {}
    assert spec.get("frameskip") == 1 and spec.get("repeat_action_probability") == 0.0
    assert env.unwrapped.get_action_meanings()[:2] == ["NOOP", "FIRE"] and env.action_space.n == 6
    assert ale_env.game_return({"episode": {"r": np.array([-21.0])}}) == -21.0  # Gymnasium 0.29's layout
    assert ale_env.game_return({"episode": {"r": 3.0}}) == 3.0 and ale_env.game_return({}) is None
    env.close()
