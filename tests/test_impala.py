"""IMPALA: the trajectory queue, the queue's flow control, the actors' trajectories (an episode's end inside one,
terminated vs truncated), bad input, and a whole job on 4 ranks that learns CartPole."""

from __future__ import annotations

import math
import os
import signal

from types import SimpleNamespace

import gymnasium as gym
import h5py
import numpy as np
import pytest

from mpirl import config
from mpirl.metrics.summary import window_means
from mpirl.agents.actor_critic import trajectory_spec
from mpirl.algos.impala.flow import Windows, queue_budget, queue_slots, window
from mpirl.algos.impala.serving import version_of, with_version
from mpirl.replay.trajectory_queue import QueueFull, TrajectoryQueue
from mpirl.envs.actions import action_spec, discrete
from mpirl.envs.outcomes import Outcome

from conftest import JOBS, finish, ranks_of, run_cli, run_mpi, start_mpi, train_steps, wait_for
from mpirl.job import checkpoint

JOB = JOBS / "impala_cartpole.toml"


def load(*sets: str):
    cfg, _ = config.load(JOB, list(sets))
    return cfg


# ---------------------------------------------------------------- the queue
def test_the_queue_serves_oldest_first_each_once_and_refuses_to_overflow():
    spec = trajectory_spec((2,), np.float32, 3)
    q = TrajectoryQueue(spec, 5)
    rec = {k: np.zeros((3, *shape), dtype) for k, (shape, dtype) in spec.items()}
    rec["version"][:] = [10, 11, 12]
    q.add(rec)
    out = {k: np.zeros((2, *shape), dtype) for k, (shape, dtype) in spec.items()}
    ids, versions = q.take_into(2, out)
    assert out["version"].tolist() == [10, 11] and versions.tolist() == [0, 1] and q.size == 1
    rec["version"][:] = [13, 14, 15]
    q.add(rec)  # wraps around the end of the slots
    with pytest.raises(QueueFull):
        q.add(rec)  # 4 waiting + 3 > 5: refused, nothing dropped
    assert q.size == 4
    ids, versions = q.take_into(2, out)
    assert out["version"].tolist() == [12, 13] and versions.tolist() == [2, 3]
    with pytest.raises(ValueError):
        q.take_into(3, {k: np.zeros((3, *shape), dtype) for k, (shape, dtype) in spec.items()})


def test_a_replay_share_serves_fresh_trajectories_once_and_draws_the_rest_from_those_served_before():
    """Batches of 4 with 2 replayed: the first batch is all fresh (the replay is empty); after it, every batch holds
    the 2 oldest waiting trajectories, each exactly once over the run, and 2 drawn from trajectories served in
    earlier batches (never from this batch's fresh ones, never one still waiting), with probability 1 / the replay's
    size; the replay keeps only the last 6 served."""
    spec = trajectory_spec((1,), np.float32, 2)
    q = TrajectoryQueue(spec, 64, replay=6)
    rng = np.random.default_rng(0)
    out = {k: np.zeros((4, *shape), dtype) for k, (shape, dtype) in spec.items()}
    added, served, fresh_seen = 0, [], []
    for step in range(12):
        rec = {k: np.zeros((4, *shape), dtype) for k, (shape, dtype) in spec.items()}
        rec["version"][:] = np.arange(added, added + 4)
        q.add(rec)
        added += 4
        assert q.fresh(4, 2) == (4 if step == 0 else 2)
        ids, versions, probs = q.take_batch(4, 2, out, rng)
        got = out["version"].tolist()
        n_fresh = 4 if step == 0 else 2
        fresh, again = got[:n_fresh], got[n_fresh:]
        assert fresh == list(range(len(fresh_seen), len(fresh_seen) + n_fresh))  # oldest waiting first
        assert probs[:n_fresh].tolist() == [1.0] * n_fresh and versions[:n_fresh].tolist() == fresh
        recent = served[-6:]
        assert all(v in recent for v in again), (again, recent)  # from the last 6 served before this batch
        assert probs[n_fresh:].tolist() == [1.0 / max(len(recent), 1)] * len(again)
        fresh_seen += fresh
        served += fresh
    assert fresh_seen == list(range(len(fresh_seen)))  # every fresh trajectory exactly once, in order
    assert q.replay.size == 6 and sorted(q.replay.versions.tolist()) == served[-6:]


@pytest.mark.parametrize("sets,key", [
    (["impala.replay_share=0.5"], "impala.replay_capacity"),
    (["impala.replay_capacity=64"], "impala.replay_share"),
    (["impala.replay_share=0.5", "impala.replay_capacity=64", "impala.exchange=\"sync\"", "comm.n_update=1",
      "replay.batch_size=16"], "impala.replay_share"),
    (["impala.replay_share=0.01", "impala.replay_capacity=64"], "impala.replay_share"),
    (["impala.replay_share=0.5", "impala.replay_capacity=8"], "impala.replay_capacity"),
    (["impala.replay_share=1"], "impala.replay_share"),
])
def test_bad_replay_settings_are_refused_naming_the_key(sets, key):
    err = _refusal(4, *sets)
    assert key in f"{err.key}: {err.message}", (err.key, err.message)


class _QueueSim:
    """Actors, their queues and the learner without MPI, each actor's flow control as the job's: under "async" the
    queue's :class:`Windows` (grants seen at once, as the worst case for the fill), under "sync" the version budget
    (a version seen only when published). ``pace[a]``: actor a may send one message every ``pace[a]`` ticks."""

    def __init__(self, cfg, actors: int, buffers: int, E: int, pace=None):
        self.cfg, self.E, self.buffers, self.group = cfg, E, buffers, actors // buffers
        self.sync = cfg.impala.exchange == "sync"
        self.budget = queue_budget(cfg, actors, buffers, self.group)
        self.windows = [Windows(range(self.group), window(cfg, self.group)) for _ in range(buffers)]
        self.slots = queue_slots(cfg, buffers, self.group, E)
        self.pace = pace or [1] * actors
        self.sent, self.fill, self.most = [0] * actors, [0] * buffers, 0
        self.version, self.steps, self.tick = 1, 0, 0

    def over(self, a: int) -> bool:
        q, i = divmod(a, self.group)
        if self.sync:
            return self.budget.over(self.sent[a], self.version)
        return self.sent[a] >= self.windows[q].granted(i)

    def advance(self, replay_share: float = 0.0) -> bool:
        """One tick: every actor whose turn it is sends all it may, then the learner trains if every queue holds its
        share; True if it trained."""
        self.tick += 1
        for a in range(len(self.sent)):
            if self.tick % self.pace[a]:
                continue
            while not self.over(a):
                q, i = divmod(a, self.group)
                self.sent[a] += self.E
                self.fill[q] += self.E
                self.windows[q].arrived(i, self.E)
                if self.pace[a] > 1:
                    break  # a slow actor: one message per turn
        self.most = max(self.most, *self.fill)
        share = self.cfg.replay.batch_size // self.buffers
        if self.steps:  # the replays give their part once they hold it (after the first batch)
            share -= int(share * replay_share)
        if not all(f >= share for f in self.fill):
            return False
        self.fill = [f - share for f in self.fill]
        for w in self.windows:
            w.take(share)
        self.steps += 1
        if self.steps % self.cfg.comm.n_update == 0:
            self.version += 1
        return True


@pytest.mark.parametrize("exchange,actors,buffers,n_update,batch,capacity,replay_share", [
    ("async", 2, 1, 1, 32, 128, 0), ("async", 4, 2, 4, 16, 40, 0), ("async", 6, 3, 16, 60, 100, 0),
    ("sync", 2, 1, 1, 16, 32, 0), ("sync", 6, 3, 1, 48, 32, 0),
    ("async", 2, 1, 1, 32, 128, 0.5), ("async", 6, 3, 4, 60, 100, 0.75)])
def test_actors_held_to_their_allowance_never_overflow_their_queue(exchange, actors, buffers, n_update, batch,
                                                                   capacity, replay_share):
    """A simulation of the worst case: every actor sends all it is allowed (one message of E trajectories at a
    time) whenever it may; the learner takes B / R of every queue per batch. The fill never passes queue_slots,
    and the learner never waits for a queue that its actors are not allowed to fill. Synchronous rounds: one
    message per actor and version, exactly. With a replay share the first batch is all fresh, the later ones take
    the share's fresh part of every queue."""
    replay = [f"impala.replay_share={replay_share}", f"impala.replay_capacity={batch}"] if replay_share else []
    cfg = load(f"comm.n_update={n_update}", f"replay.batch_size={batch}", f"replay.capacity={capacity}",
               f"topology.buffers={buffers}", "env.envs_per_actor=8", f'impala.exchange="{exchange}"', *replay)
    sim = _QueueSim(cfg, actors, buffers, 8)
    for _ in range(20_000):
        if not sim.advance(replay_share):
            pytest.fail(f"the learner starved: fills {sim.fill}")
    assert sim.most <= sim.slots, (sim.most, sim.slots)
    if exchange == "sync":
        assert all(s == 8 * (sim.version - 1) for s in sim.sent), (sim.sent, sim.version)  # a round per version


def test_a_fast_actor_takes_up_the_room_a_slow_one_leaves():
    """The survey's straggler under "async": actor 1 may send only every 4th tick. Its window stays its own, and
    the fast actor's room comes back as the learner takes its trajectories, so the fast actor sends most of what
    the learner trains on and the learner trains nearly every tick (an equal share of the consumption per actor, the
    flow control this replaced, held the fast actor to the slow one's pace: in this simulation the learner then
    trained on 504 of the 4,000 ticks, and the fast actor sent no more than the slow one)."""
    cfg = load("replay.batch_size=32", "replay.capacity=128", "env.envs_per_actor=8")
    sim = _QueueSim(cfg, 2, 1, 8, pace=[1, 4])
    trained = sum(sim.advance() for _ in range(4000))
    assert sim.most <= sim.slots, (sim.most, sim.slots)
    assert sim.sent[0] > 3 * sim.sent[1], sim.sent  # the fast actor sends at its own pace
    assert trained > 0.9 * 4000, trained
    # Both actors' rows are all accounted for: taken, or still waiting in the queue.
    w = sim.windows[0]
    assert sum(w.taken.values()) + sim.fill[0] == sum(sim.sent)


def test_windows_give_each_message_back_to_its_sender_oldest_first():
    w = Windows([1, 2], 10)
    w.arrived(1, 4)
    w.arrived(2, 4)
    w.arrived(1, 0)  # a goodbye without trajectories holds no room
    w.arrived(1, 4)
    assert w.take(6) == {1, 2} and (w.granted(1), w.granted(2)) == (14, 12)
    assert w.take(2) == {2} and w.granted(2) == 14
    assert w.take(8) == {1} and w.granted(1) == 18  # only 4 were waiting: the rest finds nothing to give back
    assert w.take(1) == set()


# ---------------------------------------------------------------- the actors' trajectories
class _Spaces:
    obs_shape, obs_dtype, action = (4,), np.dtype(np.float32), discrete(2)


def _outcome(obs, reward=0.0, terminated=(), truncated=(), final=None, taken=(0, 0), fresh=False):
    n = len(obs)
    rows = {"obs": np.asarray(obs, np.float32), "final_obs": np.asarray(final if final is not None else obs, np.float32),
            "taken": np.asarray(taken), "reward": np.full(n, reward, np.float32),
            "terminated": np.isin(np.arange(n), terminated), "truncated": np.isin(np.arange(n), truncated),
            "life_lost": np.zeros(n, bool)}
    return Outcome(rows, fresh)


def test_a_trajectory_crossing_an_episode_end_keeps_terminated_and_truncated_apart():
    """Two games, trajectories of 4 steps. Game 0 terminates after step 1, game 1 is truncated after step 2: the
    records say so at those steps, the truncated one carries the policy's value of its final observation, the
    observations after the ends are the new episodes' first, and the next trajectory starts where this one ended."""
    from mpirl.algos.impala.serving import ImpalaDeciding
    cfg = load("impala.unroll=4", "env.envs_per_actor=2")
    spec = trajectory_spec((4,), np.float32, 4)
    d = ImpalaDeciding(cfg, _Spaces, spec, [1])
    flat = with_version(0.3 * np.random.default_rng(0).normal(size=d.policy.n_params).astype(np.float32), 7)
    d.policy.load_flat(flat)
    o = [np.full((2, 4), float(i)) for i in range(8)]
    prev = _outcome(o[0], fresh=True)
    d.observe(0, prev)
    final = np.full((2, 4), 99.0)
    steps = [_outcome(o[1], 1.0, taken=(1, 0)), _outcome(o[2], 1.0, terminated=[0], taken=(0, 1), final=final),
             _outcome(o[3], 1.0, truncated=[1], taken=(1, 1), final=final), _outcome(o[4], 1.0)]
    for s in steps:  # as the actor loop: decide on what the last step showed, then record what the step led to
        d.decide([0], [prev])
        d.observe(0, s)
        prev = s
    assert d.staging.count == 2
    rec, _ = d.take(2)
    assert rec["terminated"].tolist() == [[False, True, False, False], [False, False, False, False]]
    assert rec["truncated"].tolist() == [[False, False, False, False], [False, False, True, False]]
    value = float(d.policy.values(final[1:2])[0])
    assert rec["final_value"][1, 2] == pytest.approx(value) and rec["final_value"][0].tolist() == [0, 0, 0, 0]
    assert rec["obs"][:, :, 0].tolist() == [[0, 1, 2, 3, 4]] * 2
    assert rec["action"].tolist() == [[1, 0, 1, 0], [0, 1, 1, 0]]
    assert rec["version"].tolist() == [7, 7]
    for t in range(4):  # the behaviour policy's log-probability of the action taken, from the obs it was taken on
        want = d.policy.outputs(o[t].astype(np.float32))[np.arange(2), rec["action"][:, t]]
        assert rec["logp"][:, t] == pytest.approx(want, rel=1e-5)
    assert sorted(d.episodes) == [(2.0, 2), (3.0, 3)]  # returns unclipped, lengths in steps
    d.drop(2)
    d.policy.load_flat(with_version(flat[:-1], 8))  # new parameters before the next trajectory's first action
    s = _outcome(o[5], 1.0)
    d.decide([0], [prev])
    d.observe(0, s)
    assert d.traj["obs"][0, :2, 0].tolist() == [4, 5]  # the next trajectory starts where the last ended
    assert d.traj["version"].tolist() == [8, 8]  # ... and records the version its first action was chosen with


@pytest.mark.parametrize("space", [gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.MultiDiscrete([3, 2])],
                         ids=["box", "multidiscrete"])
def test_the_learners_pass_reproduces_the_actors_log_probabilities_of_continuous_and_multidiscrete_actions(space):
    """Trajectories recorded by the actors' decisions (a Gaussian's samples, past the bounds too, stored unclipped;
    two categoricals) give, through the learner's network with the same parameters, the log-probabilities the
    actors stored."""
    import torch
    from mpirl.agents.actor_critic import actor_critic
    from mpirl.algos.impala.serving import ImpalaDeciding
    cfg = load("impala.unroll=4", "env.envs_per_actor=2", "agent.log_std_init=0.5")
    act = action_spec(space, "test")
    spaces = SimpleNamespace(obs_shape=(4,), obs_dtype=np.dtype(np.float32), action=act)
    spec = trajectory_spec((4,), np.float32, 4, act)
    d = ImpalaDeciding(cfg, spaces, spec, [1])
    flat = with_version(0.3 * np.random.default_rng(0).normal(size=d.policy.n_params).astype(np.float32), 3)
    d.policy.load_flat(flat)
    net = actor_critic((4,), act, cfg.agent)
    torch.nn.utils.vector_to_parameters(torch.as_tensor(flat[:-1]), net.parameters())
    rng = np.random.default_rng(1)
    prev = _outcome(rng.normal(size=(2, 4)), fresh=True, taken=np.zeros((2, *act.shape), act.dtype))
    d.observe(0, prev)
    for _ in range(4):
        actions = d.decide([0], [prev])
        prev = _outcome(rng.normal(size=(2, 4)), 1.0, taken=actions)
        d.observe(0, prev)
    rec, _ = d.take(2)
    assert rec["action"].shape == (2, 4, *act.shape) and rec["action"].dtype == act.dtype
    if act.continuous:
        assert np.abs(rec["action"]).max() > 1  # some samples past the bounds, stored as sampled
    obs = torch.as_tensor(rec["obs"][:, :-1].reshape(8, 4))
    with torch.no_grad():
        out, _ = net(obs)
        logp, _ = net.log_prob_entropy(out, torch.as_tensor(rec["action"].reshape(8, *act.shape)))
    assert np.allclose(logp.numpy().reshape(2, 4), rec["logp"], rtol=1e-5, atol=1e-5)


def test_the_version_rides_the_broadcast_exactly_past_float32s_integers():
    """2**24 + 1 is not a float32: as a value it would come back as 2**24; as int32 bits it comes back whole."""
    flat = np.arange(5, dtype=np.float32)
    for v in (0, 1, 2**24 + 1, 2**31 - 1):
        params = with_version(flat, v)
        assert params.dtype == np.float32 and version_of(params) == v and np.array_equal(params[:-1], flat)


# ---------------------------------------------------------------- bad input
def _refusal(n: int, *sets: str) -> config.ConfigError:
    """The ConfigError the job with ``sets`` gets on ``n`` ranks: from loading it, or from IMPALA's checks (what
    ``mpirl validate`` and every rank run before the first message)."""
    from mpirl.registry import algorithm
    with pytest.raises(config.ConfigError) as err:
        cfg = load(*sets)
        algorithm("impala").check(cfg, n, str(JOB))
    return err.value


@pytest.mark.parametrize("sets,key", [
    (["impala.unroll=0"], "impala.unroll"),
    (["impala.rho_bar=0"], "impala.rho_bar"),
    (["impala.c_bar=-1"], "impala.c_bar"),
    (["impala.rho_bar=nan"], "impala.rho_bar"),
    (["impala.exchange=\"rounds\""], "impala.exchange"),
    (["impala.actor_delay_us=[0, 0, 0]"], "impala.actor_delay_us"),
    (["replay.batch_size=4", "replay.capacity=4"], "replay.capacity"),
    (["topology.buffers=2", "replay.batch_size=33"], "replay.batch_size"),
    (["impala.exchange=\"sync\"", "comm.n_update=1"], "replay.batch_size"),
    (["impala.exchange=\"sync\"", "replay.batch_size=16", "comm.n_update=4"], "comm.n_update"),
    (["env.id=\"tests.odd_spaces_env:DictActions-v0\""], "env.id"),
    (["apex.n_step=3"], "apex"),
    (["replay.alpha=0.5"], "replay.alpha"),
    (["topology.buffers=0", "topology.workers=1"], "topology.workers"),
])
def test_bad_impala_input_is_refused_naming_the_key(sets, key):
    err = _refusal(4, *sets)
    assert key in f"{err.key}: {err.message}", (err.key, err.message)


def test_a_world_whose_actors_do_not_spread_evenly_over_the_queues_is_refused():
    err = _refusal(6, "topology.buffers=2", "replay.batch_size=32")
    assert err.key == "world size" and "same number of actors" in err.message, err.message


def test_an_action_space_no_policy_takes_is_exit_2_naming_env_id():
    """The whole path once, from the command line: Dict actions are exit 2, the key and the reason, no traceback."""
    proc = run_cli("validate", str(JOB), "-n", "4", "--set", 'env.id="tests.odd_spaces_env:DictActions-v0"')
    assert proc.returncode == 2 and "env.id" in proc.stderr and "Dict" in proc.stderr, proc.stderr
    assert "Discrete, MultiDiscrete and Box" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------- a whole job
ENV_STEP_BUDGET = 1_500_000


@pytest.mark.learning
@pytest.mark.mpi
@pytest.mark.parametrize("exchange", ["async", "sync"])
def test_impala_learns_cartpole_on_4_ranks(tmp_path, exchange):
    """Every role exits 0, returns rise from random play (about 22) past 195 within the env-step budget (this
    machine: 475 after about 700,000), the trajectories' policy lag is recorded (none in synchronous rounds), and
    the queue never held more than its slots."""
    sync = ["comm.n_update=1", "replay.batch_size=16"] if exchange == "sync" else []
    job = run_mpi(4, tmp_path, f"run.env_steps={ENV_STEP_BUDGET}", "run.wall_seconds=0", "run.target_return=195",
                  f'impala.exchange="{exchange}"', "impala.test_episodes=50", *sync, job=JOB, timeout=3600,
                  stall=300)
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        reason = f.attrs["stop_reason"]
        t = {k: f["learner/train"][k][()] for k in ("return_mean20", "lag_mean", "lag_max", "entropy", "env_steps")}
        eps = f["buffer_1/episodes/return"][()]
        fill = f["buffer_1/buffer/fill"][()]
        test = {k: f["learner/test"][k][()] for k in ("return_mean", "episodes", "train_steps")}
        # CartPole's vector observations: the actors' policy in numpy (mpirl/agents/actor_critic_acting.py), torch
        # never imported on their ranks
        assert set(f["buffer_1/actors/actor"][()]) == {2, 3} and not f["buffer_1/actors/torch_imported"][()].any()
    assert "reached 195" in reason, (f"IMPALA did not reach mean return 195 over 20 episodes within "
                                     f"{ENV_STEP_BUDGET} env steps: stopped by {reason!r}, last-20 mean "
                                     f"{t['return_mean20'][-1]:.1f} after {t['env_steps'][-1]} env steps")
    # Returns rose from random play, in the buffer's own table: its best 20 episodes in a row. (The learner's window,
    # which fired the stop, counts episodes as the queue forwards them; the table's last 20 also hold those played
    # until the stop reached the actors, by a policy that may have moved on: once, on a loaded machine, 52 after a
    # window of 195.)
    best = window_means(eps, 20).max()
    assert eps[:20].mean() < 60 and best > max(60, 3 * eps[:20].mean()), (eps[:20].mean(), best, eps[-20:].mean())
    lag = t["lag_mean"][np.isfinite(t["lag_mean"])]
    if exchange == "sync":  # every round acted with the parameters the last round made
        assert len(lag) and lag.max() == 0 and np.nanmax(t["lag_max"]) == 0, t["lag_max"]
    else:  # trajectories acted while the learner moved on: a lag of a few versions
        assert len(lag) and 0 < lag.mean() < 10 and np.nanmax(t["lag_max"]) >= 1, t["lag_mean"]
    assert t["entropy"][np.isfinite(t["entropy"])][-1] < math.log(2)  # the policy left uniform
    # The learner's own test round at the stop: 50 episodes of the final (sampled) policy, far above random play
    # (about 22 a game, so 22 +- 1.7 over 50). Not at the window's 195: the policy still swings as it learns, and
    # the stop can fall in a trough. Sync, the same seed, 12 runs side by side: the stop at train step 412, 452, 453
    # or 456 (when the window fills), 50 episodes there 239, 67, 164, 297; a test round every 2 steps over steps
    # 380-486 ranged 62 to 382 (10 episodes each). At step 452 the old bar, 60 over 10 episodes, failed one suite
    # (59.6; 67 +- 4.7 over 50). (Whether a stop means the saved policy plays at the target is issue 60's evaluation.)
    assert test["episodes"].tolist() == [50] and test["return_mean"][0] > max(40, 2 * eps[:20].mean()), test
    cfg = load()
    assert fill.max() <= queue_slots(cfg, 1, 2, 8)


@pytest.mark.mpi
def test_with_a_replay_share_half_of_every_batch_after_the_first_comes_from_the_queues_replay(tmp_path):
    """impala.replay_share = 0.5 on 4 ranks: every role exits 0; the queue's rows count the trajectories it served
    from its replay, half of each batch after the first, and the replayed ones, acted with older parameters, show
    in the policy lag."""
    batch, steps = 32, 150
    job = run_mpi(4, tmp_path, f"run.train_steps={steps}", "run.wall_seconds=0", "run.target_return=nan",
                  "impala.replay_share=0.5", "impala.replay_capacity=256", f"replay.batch_size={batch}", job=JOB,
                  timeout=600)
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["stop_reason"] == f"train_steps {steps} reached"
        replayed = int(f["buffer_1/buffer/replayed"][()].sum())
        lag = f["learner/train/lag_max"][()]
    # Half of every batch but the first; the queue may have served the requests still in flight at the stop
    # (comm.prefetch = 1: two) that the learner did not train on.
    assert replayed % (batch // 2) == 0 and steps - 1 <= replayed // (batch // 2) <= steps + 1, replayed
    # The replay holds the last 256 served trajectories, 16 batches' fresh halves: lags of many versions.
    assert np.nanmax(lag) >= 8, lag


@pytest.mark.mpi
@pytest.mark.parametrize("buffers", [1, 0])
def test_a_slowed_actor_does_not_hold_the_fast_one_back(tmp_path, buffers):
    """The survey's straggler under "async" on 4 ranks: the last actor sleeps 0.1 s a step (an unroll of 20 steps
    takes it 2 s). The queue gives the fast actor its room back as the learner takes its trajectories, so 60 batches
    of 32 trajectories are trained on and every role exits 0, and nearly all came from the fast actor (under the
    equal-share flow control this replaced, the fast actor could send only 16 trajectories per batch beyond its
    window, and the run waited on the slow one's 8 trajectories per 2 s for the rest). With ``buffers = 0`` the
    learner sends the parameters itself, to each actor on its own: the stop reaches the slow actor although its
    last parameters were still on their way when the learner stopped."""
    steps = 60
    job = run_mpi(4 - (buffers == 0), tmp_path, f"run.train_steps={steps}", "run.wall_seconds=0",
                  "run.target_return=nan", "impala.actor_delay_us=[0, 100000]", "impala.test_episodes=0",
                  f"topology.buffers={buffers}", job=JOB, timeout=900, stall=300)
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["stop_reason"] == f"train_steps {steps} reached"
        a = f[f"buffer_{buffers}/actors"]
        actor, env_steps = a["actor"][()], a["env_steps"][()]
        throttled = a["throttled_s"][()]
    fast, slow = sorted(np.unique(actor))
    last = {x: int(env_steps[actor == x][-1]) for x in (fast, slow)}
    # The learner trained on 60 x 32 trajectories of 20 steps: 38,400 steps, the slow actor's 8 games made a few
    # hundred a second at most.
    assert last[fast] > 4 * last[slow], last
    assert throttled[actor == slow][-1] == 0.0  # the slow actor never used up its window


@pytest.mark.mpi
@pytest.mark.parametrize("workers,exchange", [("1", "async"), ('"learner"', "async"), ("1", "sync"),
                                              ('"learner"', "sync")])
def test_an_impala_job_with_inference_workers_runs_and_learns(tmp_path, workers, exchange):
    """GA3C's predictor / SEED's layout: a worker rank (or the learner's rank) runs the policy for the actors and
    builds their trajectories; every role exits 0, the worker served steps, and returns rose. In synchronous
    rounds the worker holds an actor that has finished its round until the round's parameters come: no trajectory
    is acted with older ones (a lag of 0 in every batch)."""
    n = 5 if workers == "1" else 4
    sync = ['impala.exchange="sync"', "replay.batch_size=16"] if exchange == "sync" else []
    job = run_mpi(n, tmp_path, "run.train_steps=150", "run.wall_seconds=0", "run.target_return=nan",
                  f"topology.workers={workers}", *sync, job=JOB, timeout=600)
    assert job.proc.returncode == 0, job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["stop_reason"] == "train_steps 150 reached"
        worker = "worker_2" if workers == "1" else "worker_0"
        assert f[f"{worker}/worker/steps_served"][-1] > 0
        eps = f["buffer_1/episodes/return"][()]
        lag_mean, lag_max = f["learner/train/lag_mean"][()], f["learner/train/lag_max"][()]
    assert np.isfinite(lag_mean).any()
    if exchange == "sync":
        assert np.nanmax(lag_max) == 0, lag_max
    assert eps[-20:].mean() > eps[:20].mean(), (eps[:20].mean(), eps[-20:].mean())


@pytest.mark.mpi
@pytest.mark.parametrize("role,rank", [("learner", 0), ("queue", 1), ("actor", 3)])
def test_a_killed_rank_ends_an_impala_job_and_resume_continues(tmp_path, role, rank):
    """kill -9 of the learner, the queue's buffer rank or an actor: the job ends (never a hang) with a checkpoint
    to resume from; after the learner's death (the hardest: only its periodic checkpoint is left) --resume
    continues to the end, the learner's rows one axis (resuming is the same path whichever rank died)."""
    out = tmp_path / "runs"
    sets = ("run.target_return=nan", "run.env_steps=0", "run.wall_seconds=0", "checkpoint.every_steps=30",
            "log.interval=0.2", "log.flush_seconds=0.2")
    with start_mpi(4, out, "run.train_steps=1000000", *sets, job=JOB) as job:
        wait_for(job, lambda: train_steps(out) >= 45, "45 train steps (a checkpoint at 30)")
        os.kill(ranks_of(job.pid)[rank], signal.SIGKILL)
        code, text = finish(job, 120)
    assert code != 0 and f"rank {rank}" in text and "signal 9" in text, text[-3000:]
    run_dir = next(out.glob("*/run.h5")).parent
    done = int(checkpoint.checkpoints(run_dir)[-1].name[5:15])
    assert done >= 30  # a periodic checkpoint, or the one a rank that outlived the kill wrote as it was stopped
    if role != "learner":
        return
    steps = done + 40
    job = run_mpi(4, out, f"run.train_steps={steps}", *sets, job=JOB, args=("--resume", str(run_dir)))
    assert job.proc.returncode == 0, job.output
    with h5py.File(run_dir / "run.h5", "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["stop_reason"] == f"train_steps {steps} reached"
        rows = f["learner/train/train_steps"][()]
        assert np.all(np.diff(rows) >= 0) and rows[-1] == steps
        assert np.all(np.diff(f["learner/train/time"][()]) >= 0)


def test_buffers_0_is_for_impala_only():
    """The replay algorithms keep their replay on buffer ranks: topology.buffers = 0 is refused naming it."""
    with pytest.raises(config.ConfigError) as err:
        config.load(JOBS / "cartpole.toml", ["topology.buffers=0"])
    assert err.value.key == "topology.buffers" and "impala" in err.value.message


@pytest.mark.mpi
@pytest.mark.parametrize("exchange", ["async"])  # sync's rounds are the same budget (its 4-rank test above)
def test_with_buffers_0_the_actors_send_straight_to_the_learners_queue(tmp_path, exchange):
    """No buffer rank: 3 ranks, the learner and two actors. Every role exits 0, the learner's intake writes
    buffer_0.h5 as a buffer rank would (episodes, actors, the queue's fill), the learner counts the actors' env
    steps and episodes, and returns rise."""
    sync = ["comm.n_update=1", "replay.batch_size=16"] if exchange == "sync" else []
    job = run_mpi(3, tmp_path, "topology.buffers=0", "run.train_steps=150", "run.wall_seconds=0",
                  "run.target_return=nan", f'impala.exchange="{exchange}"', *sync, job=JOB, timeout=600)
    assert job.proc.returncode == 0, job.output
    assert "ranks: 0 learner and queue; 1-2 actors" in job.output
    with h5py.File(job.run_dir / "run.h5", "r") as f:
        assert f.attrs["stop_reason"] == "train_steps 150 reached"
        eps = f["buffer_0/episodes/return"][()]
        actors = set(f["buffer_0/actors/actor"][()].tolist())
        fill = f["buffer_0/buffer/fill"][()]
        t = {k: f["learner/train"][k][()] for k in ("env_steps", "episodes", "lag_max")}
    assert actors == {1, 2} and len(fill) and t["env_steps"][-1] > 0 and t["episodes"][-1] > 0
    assert eps[-20:].mean() > eps[:20].mean(), (eps[:20].mean(), eps[-20:].mean())
    if exchange == "sync":
        assert np.nanmax(t["lag_max"]) == 0
