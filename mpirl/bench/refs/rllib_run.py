"""One RLlib run (new API stack) on CartPole-v1, a MinAtar game or an Atari game, to a mean return of TARGET over
the last 20 episodes (``inf``: none, the run takes its budget or its wall):

    python rllib_run.py ALGO SEED BUDGET WALL TARGET [ENV]     (ALGO: ppo, appo or impala; ENV: CartPole-v1
                                                                 (default), MinAtar/Breakout-v1, ALE/Pong-v5 or
                                                                 ALE/Breakout-v5)

Runs in the RLlib reference venv (:mod:`mpirl.bench.reference_venv`; it imports nothing of mpirl) and prints one
JSON line (below). All runs have 2 env runners of 8 games each and the learner in the driver process
(``num_learners = 0``: with 2 CPUs a remote learner leaves APPO waiting forever, as the project's field notes say).
Settings:

* CartPole-v1: RLlib's own tuned CartPole examples (the repository's
  ``rllib/examples/algorithms/{ppo,appo,impala}/cartpole_*.py``) except 8 games per env runner (the examples
  have 1; mpirl's actors and Sample Factory's workers have 8);
* a MinAtar game (:mod:`minatar_env`; APPO and IMPALA only): RLlib's own Atari examples
  (``rllib/examples/algorithms/appo/atari_appo.py``, ``.../impala/pong_impala.py``: batch 500 per learner, value
  loss 1.0, entropy 0.01 (APPO) or 0.02 (IMPALA) decaying to 0 over 3M steps, lr 5e-4 / 9e-4; APPO's circular
  buffer of 4 batches each trained up to twice, target network every 2 updates, weights broadcast every 5; IMPALA's
  global-norm clip 30) without what is Atari's alone (frame stacking, reward clipping, APPO's 2 aggregator actors
  that 2 CPUs have no room for), 8 games per env runner (as mpirl's actors and Sample Factory's workers have;
  the examples have 5), and MinAtar's network in RLlib's default model: one 16x3x3 convolution (valid padding),
  then a 128-wide layer in each of the policy and value heads (the encoder shared);
* an Atari game (APPO and IMPALA only; :func:`make_env`): the same examples (``atari_appo.py`` / ``pong_appo.py``,
  ``pong_impala.py``) whole: their game settings (one frame a step, minimal actions, no sticky actions: the game
  is :mod:`ale_env`'s), RLlib's Atari wrapper ``wrap_atari_for_new_api_stack`` (grayscale and resize each frame,
  scale to [-1, 1] as float32, max over the last 2 of 4 frames, 30 no-op starts, a lost life ends the episode it
  trains on, FIRE at reset where the game has it, a 108,000-frame cap), 4 frames stacked by RLlib's connectors
  (``FrameStackingEnvToModule`` / ``FrameStackingLearner``, as the examples stack them), rewards clipped
  (``clip_rewards=True``), and their training settings above, except: frames 84x84 (the examples' 64x64) with
  RLlib's default convolutions for 84x84 (``get_filter_config``: 16 8x8/4, 32 4x4/2, 256 11x11/1, the last with
  valid padding as RLlib's old-stack network built it, so 1x1x256 out: ``DefaultModelConfig`` pads all "same"
  unless told, which leaves an 11x11x256 map, 30,976 features into each head) instead of the examples' 4 stride-2
  layers for 64x64, then the examples' 256-wide layer in each head (``head_fcnet_hiddens``; IMPALA's example names
  it with the old stack's ``post_fcnet_hiddens``), the encoder shared; 2 env runners of 8 games (the examples
  have 5 games, or 2 in ``pong_appo.py``, and more env runners); no aggregator actors (APPO's examples have 2,
  each wanting a CPU of its own that the 2 env runners leave none of). Its observations are float32 (RLlib's
  wrapper scales them), where Sample Factory's and mpirl's are uint8.

Episodes and env steps are recorded by :mod:`episode_file` in every env runner (an Atari episode is the whole game
with its unclipped return). **The run's clock starts at the first env step any env runner took** (after
``ray.init`` and ``build_algo``, as mpirl's MPI start-up and Sample Factory's start-up are left out). The wall stops
a run only once RLlib has reported env steps sampled (and, but for PPO, trained), or ``GRACE`` seconds after it:
the rates divide those counts by the seconds it took.

The JSON line: the crossing (seconds since the first env step, env steps of the episodes finished by then,
episodes; null if not reached); ``env_steps_sampled``, RLlib's ``num_env_steps_sampled_lifetime`` (agent steps:
its env runners count a step of the vector env as one step a game, the frame skip being inside the game's
wrapper) and ``env_steps_stepped``, :mod:`episode_file`'s count of the same steps (up to the end of the last
iteration, where RLlib's counts those its env runners had reported); ``frameskip`` (4 for Atari, else 1: frames =
agent steps x frameskip); ``env_steps_trained``, RLlib's ``num_env_steps_trained_lifetime``, which its learner adds
a batch's env steps to at every update on it (so APPO's counts each circular-buffer pass, up to 2 a batch, and
IMPALA's each batch once; PPO's, every minibatch of every epoch, is not reported: null), each episode chunk's
bootstrap step its learner connector adds included (816 a batch for 800 sampled on Pong here); APPO's learner reports
it every 5 updates (``broadcast_interval``), IMPALA's every update, how it was counted in
``env_steps_trained_counted``; ``seconds``; ``episodes`` and ``last20``; ``learner_busy``, the share of the seconds
its learner spent in its update step, from RLlib's own learner timer (:func:`update_seconds`) times the updates
(the env steps trained in each iteration over :func:`package_size`), an estimate: RLlib gives no total (null for
PPO, whose learner has no such timer; the reason in ``learner_busy_note``);
``first_step_at``, the seconds from this driver's start to the first env step; ``start_seconds``, from its start to
the end of ``build_algo``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from ale_env import FRAMESKIP, is_ale  # noqa: E402
from episode_file import crossing, episodes, steps_taken  # noqa: E402


CARTPOLE = "CartPole-v1"
ENVS = 8  # games per env runner, as mpirl's actors and Sample Factory's workers have
ATARI_SIZE, STACK = 84, 4  # an Atari frame's side and the frames stacked
ATARI_FILTERS = [[16, 8, 4], [32, 4, 2], [256, 11, 1, "valid"]]  # RLlib's 84x84 default, its last layer valid
GRACE = 180.0  # seconds past the wall a run may take to report its first sampled and trained steps


def config(algo: str, seed: int, env_id: str = CARTPOLE):
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    if env_id.startswith("MinAtar/"):
        return minatar_config(algo, seed)
    if is_ale(env_id):
        return atari_config(algo, seed)
    if env_id != CARTPOLE:
        raise SystemExit(f"no settings for {env_id!r}: {CARTPOLE}, a MinAtar game or an ALE/ game")
    if algo == "ppo":
        from ray.rllib.algorithms.ppo import PPOConfig
        cfg = (PPOConfig().training(lr=3e-4, num_epochs=6, vf_loss_coeff=0.01)
               .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                          vf_share_layers=True)))
    elif algo == "appo":
        from ray.rllib.algorithms.appo import APPOConfig
        cfg = (APPOConfig().training(circular_buffer_iterations_per_batch=2, vf_loss_coeff=0.05, entropy_coeff=0.0)
               .rl_module(model_config=DefaultModelConfig(vf_share_layers=True)))
    elif algo == "impala":
        from ray.rllib.algorithms.impala import IMPALAConfig
        cfg = (IMPALAConfig().training(train_batch_size_per_learner=500, grad_clip=40.0, grad_clip_by="global_norm",
                                       lr=5e-4, vf_loss_coeff=0.05, entropy_coeff=0.0)
               .rl_module(model_config=DefaultModelConfig(vf_share_layers=True)))
    else:
        raise SystemExit(f"unknown algorithm {algo!r}: ppo, appo or impala")
    return (cfg.environment("episode-logged").env_runners(num_env_runners=2, num_envs_per_env_runner=ENVS)
            .learners(num_learners=0).debugging(seed=seed))


def atari_example_training(algo: str, where: str):
    """RLlib's Atari examples' training settings (``atari_appo.py`` / ``pong_appo.py``, ``pong_impala.py``): batch
    500 per learner, value loss 1.0, entropy 0.01 (APPO) or 0.02 (IMPALA) decaying to 0 over 3M steps, lr 5e-4 /
    9e-4; APPO's circular buffer of 4 batches each trained up to twice, target network every 2 updates, weights
    broadcast every 5; IMPALA's global-norm clip 30. ``where``: the games they are for, in the refusal."""
    entropy_to_zero = 3_000_000  # env steps over which the examples take the entropy coefficient to 0
    if algo == "appo":
        from ray.rllib.algorithms.appo import APPOConfig
        return APPOConfig().training(train_batch_size_per_learner=500, target_network_update_freq=2, lr=5e-4,
                                     vf_loss_coeff=1.0, entropy_coeff=[[0, 0.01], [entropy_to_zero, 0.0]],
                                     broadcast_interval=5, circular_buffer_num_batches=4,
                                     circular_buffer_iterations_per_batch=2)
    if algo == "impala":
        from ray.rllib.algorithms.impala import IMPALAConfig
        return IMPALAConfig().training(train_batch_size_per_learner=500, grad_clip=30.0, grad_clip_by="global_norm",
                                       lr=9e-4, vf_loss_coeff=1.0, entropy_coeff=[[0, 0.02], [entropy_to_zero, 0.0]])
    raise SystemExit(f"no {where} settings for {algo!r}: appo or impala")


def minatar_config(algo: str, seed: int):
    """RLlib's Atari example settings (APPO's or IMPALA's) on a 10x10 MinAtar game, 2 env runners of 8 games."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    cfg = atari_example_training(algo, "MinAtar")
    # MinAtar's network: Conv 16x3x3/1 (valid: 8x8x16 = 1,024 features), then 128 units in each head.
    model = DefaultModelConfig(vf_share_layers=True, conv_filters=[[16, 3, 1, "valid"]], conv_activation="relu",
                               head_fcnet_hiddens=[128], head_fcnet_activation="relu")
    return (cfg.rl_module(model_config=model).environment("episode-logged")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=ENVS).learners(num_learners=0)
            .debugging(seed=seed))


def atari_config(algo: str, seed: int):
    """RLlib's Atari examples' settings (APPO's or IMPALA's) on an ALE game at 84x84, 2 env runners of 8 games."""
    from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
    from ray.rllib.connectors.learner.frame_stacking import FrameStackingLearner
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    cfg = atari_example_training(algo, "Atari")
    # RLlib's default filters for 84x84 frames (get_filter_config), the last "valid" as its old stack's network
    # built it (1x1x256 out); the new stack's DefaultModelConfig pads every layer "same" unless told, which leaves
    # an 11x11x256 map. Then the examples' 256-wide layer in each head, the encoder shared.
    model = DefaultModelConfig(vf_share_layers=True, conv_filters=ATARI_FILTERS, conv_activation="relu",
                               head_fcnet_hiddens=[256])
    return (cfg.rl_module(model_config=model).environment("episode-logged", clip_rewards=True)
            .env_runners(num_env_runners=2, num_envs_per_env_runner=ENVS,
                         env_to_module_connector=lambda _env, _spaces=None, _device=None:
                         FrameStackingEnvToModule(num_frames=STACK))
            .learners(num_learners=0, learner_connector=lambda _obs_space, _act_space:
                      FrameStackingLearner(num_frames=STACK))
            .debugging(seed=seed))


def make_env(env_id: str):
    """The env every env runner plays ``env_id`` through, :mod:`episode_file` recording its episodes: an ALE game
    as RLlib's Atari examples wrap it (``wrap_atari_for_new_api_stack``: 84x84 grayscale, scaled to [-1, 1], max over
    the last 2 of 4 frames, 30 no-op starts, a lost life ends the episode it trains on, FIRE at reset where the game
    has it; frames stacked by the connectors) over :func:`ale_env.make`'s game."""
    import episode_file
    if is_ale(env_id):
        import ale_env
        from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack
        env = wrap_atari_for_new_api_stack(ale_env.make(env_id), dim=ATARI_SIZE, frameskip=FRAMESKIP, framestack=None)
        return episode_file.EpisodeFile(env, games=True)
    return episode_file.make(env_id)


def find(result, key: str):
    """The first value of ``key`` anywhere in RLlib's nested result dict (its layout moves between versions)."""
    if isinstance(result, dict):
        if key in result and not isinstance(result[key], dict):
            return result[key]
        for v in result.values():
            found = find(v, key)
            if found is not None:
                return found
    return None


def update_seconds(result: dict) -> float | None:
    """RLlib's learner-thread timer in one result: the seconds one update took, averaged over the updates reported
    in that iteration (APPO's and IMPALA's learners update in a thread of their own, here in the driver); None
    where the iteration reported none (or the algorithm has no such thread: PPO)."""
    value = find(result.get("learners", {}), "learner_thread_update_timer")
    return None if value is None or value != value else float(value)  # NaN: no update reported


def package_size(cfg) -> int:
    """The env steps RLlib's IMPALA and APPO learners count for one update: a batch is whole sample() calls of the
    env runners (games x rollout fragment each) until there are at least ``train_batch_size_per_learner``
    (``_pre_queue_episode_refs``), and their learner connector adds one bootstrap step to each episode chunk, which
    the count includes (one chunk a game a call at least; more where episodes end within a fragment, so this is the
    least a batch counts: 816 for 800 sampled on Pong here)."""
    per_call = cfg.num_envs_per_env_runner * cfg.get_rollout_fragment_length()
    calls = -(-cfg.train_batch_size_per_learner // per_call)
    return calls * (per_call + cfg.num_envs_per_env_runner)


def main(algo: str, seed: int, budget: int, wall: float, target: float, env_id: str = CARTPOLE) -> None:
    """Every time here runs from the first env step any env runner took (``first_step_at`` after this driver's
    start: ``ray.init`` and ``build_algo`` are left out, as mpirl's MPI start-up and Sample Factory's are)."""
    t0 = time.time()  # the script's clock: the driver's start
    import ray
    from ray.tune.registry import register_env
    folder = tempfile.mkdtemp(prefix="mpirl-rllib-")
    os.environ["MPIRL_EPISODES"] = folder
    env_vars = {"MPIRL_EPISODES": folder, "PYTHONPATH": HERE, "OMP_NUM_THREADS": "1"}
    # Ray's session files go in the run's own folder, removed with it (by default they stay in /tmp/ray).
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env_vars},
             _temp_dir=os.path.join(folder, "ray"))
    try:
        register_env("episode-logged", lambda _cfg: make_env(env_id))
        algo_obj = config(algo, seed, env_id).build_algo()
        built = time.time()
        hit, sampled, trained, rows, result, origin = None, 0, 0, [], {}, None
        busy, package = 0.0, package_size(algo_obj.config)  # learner seconds in its update step, as RLlib says
        while True:
            result = algo_obj.train()
            sampled = int(find(result, "num_env_steps_sampled_lifetime") or 0)
            was, trained = trained, int(find(result, "num_env_steps_trained_lifetime") or 0)
            per_update = update_seconds(result)
            if per_update is not None and trained > was:
                busy += per_update * (trained - was) / package  # its seconds an update x the updates reported
            origin, _ = steps_taken(folder)
            rows = episodes(folder)
            hit = crossing(rows, target, origin) if origin is not None else None
            # The wall ends a run only once it has sampled and trained something: on a loaded machine RLlib's
            # first iterations can take the whole wall before its env runners report (a rate of 0 that says
            # nothing of RLlib), so a run goes on until it has counts to divide, up to GRACE seconds more.
            counted = sampled > 0 and (trained > 0 or algo == "ppo")
            elapsed = time.time() - (built if origin is None else origin)
            if hit or sampled >= budget or (elapsed >= wall and counted) or elapsed >= wall + GRACE:
                break
        end = time.time()
        _, stepped = steps_taken(folder)
        algo_obj.stop()
    finally:
        ray.shutdown()
        if os.environ.get("MPIRL_RLLIB_RESULT") and result:  # where to keep RLlib's last result, to look at
            with open(os.environ["MPIRL_RLLIB_RESULT"], "w") as f:
                json.dump(result, f, indent=1, default=str)
        shutil.rmtree(folder, ignore_errors=True)
    if origin is None:
        raise SystemExit("RLlib's env runners took no env step")
    seconds = end - origin
    none = {"seconds": None, "env_steps": None, "episodes": None}
    # PPO's lifetime count adds every minibatch pass of every epoch (about 190 per sampled step here): not a rate
    # to set beside a learner that trains each step once, so it is not reported.
    trained = None if algo == "ppo" else trained
    counted = (None if trained is None else
               "RLlib's num_env_steps_trained_lifetime: every batch each time the learner updates on it"
               + (" (each circular-buffer pass, up to 2 a batch)" if algo == "appo" else " (once a batch)"))
    if algo == "ppo":
        busy, busy_note = None, ("RLlib's PPO has no learner-thread timer: its learner updates inside the driver's "
                                 "training step")
    elif not trained:
        busy, busy_note = None, "RLlib's learner reported no update"
    else:
        busy, busy_note = busy / seconds, (
            f"RLlib's learner_thread_update_timer (seconds an update, averaged over those of an iteration) x the "
            f"updates of that iteration (its env steps trained / {package}, the least env steps it counts for a "
            f"batch: an estimate, high by the share of extra episode chunks), summed, over the seconds from the "
            f"first env step")
    print(json.dumps({str(target): hit or none, "env_steps_sampled": sampled, "env_steps_trained": trained,
                      "env_steps_trained_counted": counted, "seconds": seconds, "episodes": len(rows),
                      "last20": sum(r for _, _, r in rows[-20:]) / max(len(rows[-20:]), 1),
                      "frameskip": FRAMESKIP if is_ale(env_id) else 1, "env_steps_stepped": stepped,
                      "learner_busy": busy, "learner_busy_note": busy_note, "first_step_at": origin - t0,
                      "start_seconds": built - t0}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), *sys.argv[6:7])
