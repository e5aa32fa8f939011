"""One RLlib run on CartPole-v1 (new API stack), to a mean return of TARGET over the last 20 episodes:

    python rllib_cartpole.py ALGO SEED BUDGET WALL TARGET      (ALGO: ppo, appo or impala)

Runs in the RLlib reference venv (:mod:`mpirl.bench.reference_venv`; it imports nothing of mpirl) and prints one
JSON line: the crossing (seconds since training started, env steps, episodes; null if not reached), the env
steps sampled and trained and the seconds they took. Settings: RLlib's own tuned CartPole examples (the
repository's ``rllib/examples/algorithms/{ppo,appo,impala}/cartpole_*.py``), on 2 env runners, with the learner
in the driver process (``num_learners = 0``: with 2 CPUs a remote learner leaves APPO waiting forever, as the
project's field notes say). Episodes are recorded by :mod:`episode_file` in every env runner; times run from the
start of training (after ``ray.init`` and ``build``, as SB3's exclude model construction).
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


def config(algo: str, seed: int):
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
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
    return (cfg.environment("episode-logged-cartpole").env_runners(num_env_runners=2).learners(num_learners=0)
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


def main(algo: str, seed: int, budget: int, wall: float, target: float) -> None:
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
        register_env("episode-logged-cartpole", lambda _cfg: episode_file.make("CartPole-v1"))
        algo_obj = config(algo, seed).build_algo()
        t0_wall, t0 = time.time(), time.perf_counter()
        hit, sampled, trained, rows = None, 0, 0, []
        while True:
            result = algo_obj.train()
            sampled = int(find(result, "num_env_steps_sampled_lifetime") or 0)
            trained = int(find(result, "num_env_steps_trained_lifetime") or 0)
            rows = episodes(folder)
            hit = crossing(rows, target, t0_wall)
            if hit or sampled >= budget or time.perf_counter() - t0 >= wall:
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
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
