"""Stable-Baselines3's PPO on an Atari game with RL Baselines3 Zoo's Atari settings: the reference PPO beside ours'
PPO at the same settings (``analysis/atari_learning.py``'s ``sb3`` side).

    python -m mpirl.bench.refs.sb3_atari SEED AGENT_STEPS WALL_S ENV_ID EPISODES_FILE

The Zoo's ``hyperparams/ppo.yml`` ``atari`` entry, which is PPO's paper (Schulman et al. 2017, Table 5) and ours'
``jobs/ppo_<game>.toml``: 8 games, rollouts of 128 steps, 4 epochs of minibatches of 256, learning rate 2.5e-4 and
clip 0.1 both decaying linearly to 0 over the budget (``AGENT_STEPS``, as ours' schedules span the run's budget), GAE
0.95, gamma 0.99, value coefficient 0.5, entropy 0.01, gradients clipped to 0.5, Adam's eps 1e-5, SB3's
``CnnPolicy`` (the Nature CNN, one 512-wide layer shared by the policy and value heads, orthogonal start).
The game is SB3's own Atari pipeline (``make_atari_env``: the game's ``NoFrameskip-v4`` id, which ale-py 0.12 makes
with one frame a step and no sticky actions as ours; 30 no-op starts, 4 frames a step with the max over the last
two, a lost life ends the training episode, FIRE at reset, 84x84 grayscale, rewards clipped to their sign) and 4
frames stacked. SB3 steps its 8 games in this one process (``DummyVecEnv``) with PyTorch's threads on every core:
the same cores as ours' two workers of 4 games.

Each whole game SB3's ``Monitor`` (beneath the wrappers: the game, not a life, and the unclipped score) ends goes
into ``EPISODES_FILE`` as a row: seconds since training started (SB3's first env step follows at once), length in
agent steps (its frames / 4: the no-op start and the FIRE presses counted too, a few steps a game more than the
agent's) and return. The run stops at its budget or after ``WALL_S`` seconds; its last line on
stdout is a JSON object (``env_steps_sampled``, ``episodes``, ``seconds``).
"""

from __future__ import annotations

import json
import sys
import time

from mpirl.bench.refs.ale_env import FRAMESKIP, legacy_id

ZOO = dict(n_steps=128, n_epochs=4, batch_size=256, vf_coef=0.5, ent_coef=0.01, gamma=0.99, gae_lambda=0.95,
           max_grad_norm=0.5)
N_ENVS = 8
LR, CLIP = 2.5e-4, 0.1  # both decay linearly to 0 over the budget (the Zoo's "lin_2.5e-4", "lin_0.1")


def main(seed: int, steps: int, wall: float, env_id: str, out: str) -> dict:
    import ale_py
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    env = VecFrameStack(make_atari_env(legacy_id(env_id), n_envs=N_ENVS, seed=seed), n_stack=4)
    model = PPO("CnnPolicy", env, learning_rate=lambda left: LR * left, clip_range=lambda left: CLIP * left,
                seed=seed, device="cpu", verbose=0, **ZOO)
    model.set_logger(Logger(folder=None, output_formats=[]))  # no /tmp/SB3-* directory a run

    class Episodes(BaseCallback):
        def __init__(self, f):
            super().__init__()
            self.f, self.n = f, 0

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            now = time.perf_counter() - self.t0
            for info in self.locals.get("infos", []):
                if "episode" in info:  # Monitor's record: the whole game's score and its frames
                    self.f.write(f"{now:.3f} {info['episode']['l'] / FRAMESKIP:.2f} {info['episode']['r']:g}\n")
                    self.f.flush()  # only when a game ended: not on every step of the reference's loop
                    self.n += 1
            return now < wall

    with open(out, "w") as f:
        watch = Episodes(f)
        model.learn(total_timesteps=steps, callback=watch)
    env.close()
    return {"env_steps_sampled": int(model.num_timesteps), "episodes": watch.n,
            "seconds": time.perf_counter() - watch.t0}


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__.splitlines()[2].strip())
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5])))
