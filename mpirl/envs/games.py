"""A single-agent actor's games: a Gymnasium or Atari vector env (:mod:`mpirl.envs.vector`) stepped with the actions
it is given, rebuilt when a game fails; what every single-agent algorithm's actors play, whether they record
transitions or trajectories, on an actor rank or beside an inference worker. No network, no MPI.

Per step they give what the last actions led to (:func:`step_spec`): the action actually taken (a forced FIRE after
a life loss may replace the one given), the reward, terminated / truncated / life lost, the final observation of an
episode that ended and the observation to act on now.
"""

from __future__ import annotations

import numpy as np

from mpirl import phases
from mpirl.config import JobConfig
from mpirl.envs.vector import AtariVector, GymVector, make_vector
from mpirl.envs.outcomes import Outcome, count_failure


def action_field(spaces) -> tuple[tuple, np.dtype]:
    """One game's action, ``(shape, dtype)``: the spaces' :class:`~mpirl.envs.actions.ActionSpec` where they have
    one (the sampling policies), else one discrete action (DQN)."""
    action = getattr(spaces, "action", None)
    return (tuple(action.shape), action.dtype) if action is not None else ((), np.dtype(np.int64))


def step_spec(spaces) -> dict:
    obs = (tuple(spaces.obs_shape), np.dtype(spaces.obs_dtype))
    return {"obs": obs, "final_obs": obs, "taken": action_field(spaces), "reward": ((), np.dtype(np.float32)),
            "terminated": ((), np.dtype(np.bool_)), "truncated": ((), np.dtype(np.bool_)),
            "life_lost": ((), np.dtype(np.bool_))}


class VectorGames:
    """One actor's games (a vector env), stepped with the actions it is given; no network, no MPI."""

    def __init__(self, cfg: JobConfig, spaces, seed: int, label: str):
        self.cfg, self.seed, self.label = cfg, seed, label
        self.n = cfg.env.envs_per_actor
        self.out = {name: np.zeros((self.n, *shape), dtype) for name, (shape, dtype) in step_spec(spaces).items()}
        self.envs: GymVector | AtariVector | None = None  # built by start()
        self.env_errors = self.failing = 0

    def start(self) -> Outcome:
        """Build and reset the games (a rebuilt set gets a seed of its own)."""
        self.envs = envs = make_vector(self.cfg.env, seed=self.seed + 7919 * self.env_errors)
        self.out["obs"][:] = envs.reset()
        phases.mark("games started")  # off the step loop: the bench's "first step" is the first reset
        return Outcome(self.out, fresh=True)

    def step(self, actions: np.ndarray) -> Outcome:
        envs = self.envs
        if envs is None:
            raise RuntimeError("step() before start(): start() builds the games")
        taken = envs.forced(actions)
        try:
            step = envs.step(taken)
        except Exception as err:  # noqa: BLE001 - whatever a game raises, the actor rebuilds it and goes on
            return self.recover(err)
        self.failing = 0
        o = self.out
        o["taken"][:], o["reward"][:] = taken, step.reward
        o["terminated"][:], o["truncated"][:] = step.terminated, step.truncated
        o["life_lost"][:] = False if step.life_lost is None else step.life_lost
        o["final_obs"][:], o["obs"][:] = step.final_obs, step.obs
        return Outcome(o, fresh=False)

    def recover(self, err: Exception) -> Outcome:
        """A game raised: say so and rebuild them all (the worker drops their unfinished episodes)."""
        count_failure(self, err)
        self.close()
        return self.start()

    def close(self) -> None:
        if self.envs is not None:
            try:
                self.envs.close()
            except Exception:  # noqa: BLE001 - a broken env may not close cleanly either
                pass
            self.envs = None
