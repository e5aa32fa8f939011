"""One RLlib run (new API stack) on CartPole-v1 or a MinAtar game, to a mean return of TARGET over the last 20
episodes (``inf``: none, the run takes its budget or its wall):

    python rllib_run.py ALGO SEED BUDGET WALL TARGET [ENV]     (ALGO: ppo, appo or impala;
                                                                     ENV: CartPole-v1 (default) or MinAtar/Breakout-v1)

Runs in the RLlib reference venv (:mod:`mpirl.bench.reference_venv`; it imports nothing of mpirl) and prints one
JSON line: the crossing (seconds since training started, env steps, episodes; null if not reached), the env
steps sampled and trained and the seconds they took. All runs have 2 env runners and the learner in the driver
process (``num_learners = 0``: with 2 CPUs a remote learner leaves APPO waiting forever, as the project's field
notes say). Settings:

* CartPole-v1: RLlib's own tuned CartPole examples (the repository's
  ``rllib/examples/algorithms/{ppo,appo,impala}/cartpole_*.py``), one game per env runner;
* a MinAtar game (:mod:`minatar_env`; APPO and IMPALA only): RLlib's own Atari examples
  (``rllib/examples/algorithms/appo/atari_appo.py``, ``.../impala/pong_impala.py``: batch 500 per learner, value
  loss 1.0, entropy 0.01 (APPO) or 0.02 (IMPALA) decaying to 0 over 3M steps, lr 5e-4 / 9e-4; APPO's circular
  buffer of 4 batches each trained up to twice, target network every 2 updates, weights broadcast every 5; IMPALA's
  global-norm clip 30) without what is Atari's alone (frame stacking, reward clipping, APPO's 2 aggregator actors
  that 2 CPUs have no room for), 8 games per env runner (as mpirl's actors and Sample Factory's workers have;
  the examples have 5), and MinAtar's network in RLlib's default model: one 16x3x3 convolution (valid padding),
  then a 128-wide layer in each of the policy and value heads (the encoder shared).

Episodes are recorded by :mod:`episode_file` in every env runner; times run from the start of training (after
``ray.init`` and ``build``, as SB3's exclude model construction). The wall stops a run only once RLlib has reported
env steps sampled (and, but for PPO, trained), or ``GRACE`` seconds after it: the rates divide those counts by the
seconds it took.
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

from episode_file import crossing, episodes  # noqa: E402


CARTPOLE = "CartPole-v1"
GRACE = 180.0  # seconds past the wall a run may take to report its first sampled and trained steps


def config(algo: str, seed: int, env_id: str = CARTPOLE):
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    if env_id.startswith("MinAtar/"):
        return minatar_config(algo, seed)
    if env_id != CARTPOLE:
        raise SystemExit(f"no settings for {env_id!r}: {CARTPOLE} or a MinAtar game")
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
    return (cfg.environment("episode-logged").env_runners(num_env_runners=2).learners(num_learners=0)
            .debugging(seed=seed))


def minatar_config(algo: str, seed: int):
    """RLlib's Atari example settings (APPO's or IMPALA's) on a 10x10 MinAtar game, 2 env runners of 8 games."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    entropy_to_zero = 3_000_000  # env steps over which the examples take the entropy coefficient to 0
    if algo == "appo":
        from ray.rllib.algorithms.appo import APPOConfig
        cfg = APPOConfig().training(train_batch_size_per_learner=500, target_network_update_freq=2, lr=5e-4,
                                    vf_loss_coeff=1.0, entropy_coeff=[[0, 0.01], [entropy_to_zero, 0.0]],
                                    broadcast_interval=5, circular_buffer_num_batches=4,
                                    circular_buffer_iterations_per_batch=2)
    elif algo == "impala":
        from ray.rllib.algorithms.impala import IMPALAConfig
        cfg = IMPALAConfig().training(train_batch_size_per_learner=500, grad_clip=30.0, grad_clip_by="global_norm",
                                      lr=9e-4, vf_loss_coeff=1.0, entropy_coeff=[[0, 0.02], [entropy_to_zero, 0.0]])
    else:
        raise SystemExit(f"no MinAtar settings for {algo!r}: appo or impala")
    # MinAtar's network: Conv 16x3x3/1 (valid: 8x8x16 = 1,024 features), then 128 units in each head.
    model = DefaultModelConfig(vf_share_layers=True, conv_filters=[[16, 3, 1, "valid"]], conv_activation="relu",
                               head_fcnet_hiddens=[128], head_fcnet_activation="relu")
    return (cfg.rl_module(model_config=model).environment("episode-logged")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=8).learners(num_learners=0)
            .debugging(seed=seed))


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


def main(algo: str, seed: int, budget: int, wall: float, target: float, env_id: str = CARTPOLE) -> None:
    import ray
    from ray.tune.registry import register_env
    folder = tempfile.mkdtemp(prefix="mpirl-rllib-")
    os.environ["MPIRL_EPISODES"] = folder
    env_vars = {"MPIRL_EPISODES": folder, "PYTHONPATH": HERE, "OMP_NUM_THREADS": "1"}
    # Ray's session files go in the run's own folder, removed with it (by default they stay in /tmp/ray).
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env_vars},
             _temp_dir=os.path.join(folder, "ray"))
    try:
        import episode_file
        register_env("episode-logged", lambda _cfg: episode_file.make(env_id))
        algo_obj = config(algo, seed, env_id).build_algo()
        t0_wall, t0 = time.time(), time.perf_counter()
        hit, sampled, trained, rows = None, 0, 0, []
        while True:
            result = algo_obj.train()
            sampled = int(find(result, "num_env_steps_sampled_lifetime") or 0)
            trained = int(find(result, "num_env_steps_trained_lifetime") or 0)
            rows = episodes(folder)
            hit = crossing(rows, target, t0_wall)
            # The wall ends a run only once it has sampled and trained something: on a loaded machine RLlib's
            # first iterations can take the whole wall before its env runners report (a rate of 0 that says
            # nothing of RLlib), so a run goes on until it has counts to divide, up to GRACE seconds more.
            counted = sampled > 0 and (trained > 0 or algo == "ppo")
            elapsed = time.perf_counter() - t0
            if hit or sampled >= budget or (elapsed >= wall and counted) or elapsed >= wall + GRACE:
                break
        seconds = time.perf_counter() - t0
        algo_obj.stop()
    finally:
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
    none = {"seconds": None, "env_steps": None, "episodes": None}
    # PPO's lifetime count adds every minibatch pass of every epoch (about 190 per sampled step here): not a rate
    # to set beside a learner that trains each step once, so it is not reported.
    trained = None if algo == "ppo" else trained
    print(json.dumps({str(target): hit or none, "env_steps_sampled": sampled, "env_steps_trained": trained,
                      "seconds": seconds, "episodes": len(rows),
                      "last20": sum(r for _, _, r in rows[-20:]) / max(len(rows[-20:]), 1)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), *sys.argv[6:7])
