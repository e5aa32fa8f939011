"""An IMPALA actor's copy of the actor-critic: the head's outputs it samples from and the values of final observations.

On vector observations with a feed-forward network (``agent.network`` "mlp", or "auto" on a vector, and
``agent.recurrent = "none"``) the copy is :class:`MLPActorCritic`, :class:`~mpirl.agents.actor_critic.ActorCritic`'s
MLP computed in numpy, so the rank never imports torch (as an Ape-X actor's :mod:`mpirl.agents.acting`): an actor
starts 1.0-1.4 CPU-s sooner and holds about 195 MB less (measured: docs/performance.md). Convolutions and the LSTM core keep torch's
:class:`~mpirl.agents.actor_critic.ActorCriticPolicy`. :func:`actor_critic_acting` picks; both take the flat float32
vector the learner broadcasts (``load_flat``): the network's parameters in the torch module's ``parameters()``
order, then the job's normalisation statistics where ``[agent]`` asks for them.

The numbers are the torch network's in float32 to rounding (``tests/test_actor_critic_acting.py`` holds each to the
other): numpy's matrix products run in OpenBLAS, torch's in MKL.
"""

from __future__ import annotations

import math

import numpy as np

from mpirl.agents.flat_views import flat_views
from mpirl.agents.network_choice import network_for
from mpirl.agents.running_stats import normalization
from mpirl.agents.sampling import policy_outputs
from mpirl.envs.actions import ActionSpec, as_spec


def actor_critic_acting(obs_shape: tuple[int, ...], action: ActionSpec | int, agent_cfg, obs_dtype=None):
    """The actor's copy of the job's actor-critic: numpy for a feed-forward MLP, torch for the rest."""
    if network_for(tuple(obs_shape), agent_cfg.network) == "mlp" and agent_cfg.recurrent == "none":
        return MLPActorCritic(obs_shape, action, agent_cfg, obs_dtype)
    import torch

    from mpirl.agents.actor_critic import ActorCriticPolicy
    torch.set_num_threads(1)  # an actor's or a worker's forward passes: one thread
    return ActorCriticPolicy(obs_shape, action, agent_cfg, obs_dtype)


def mlp_actor_critic_shapes(obs_dim: int, spec: ActionSpec, hidden: list[int], shared_torso: bool
                            ) -> list[tuple[str, tuple[int, ...]]]:
    """The feed-forward MLP actor-critic's parameters, named and shaped, in the torch module's ``parameters()``
    order: a Gaussian's ``log_std`` (the module's own parameter comes before its children's), the torso's layers
    (``hidden[:-1]``), the shared ``hidden[-1]`` layer, the policy head, the value head, then a critic's own torso
    and layer (``shared_torso = False``). A layer is its weight ``(out, in)`` and its bias."""
    out: list[tuple[str, tuple[int, ...]]] = [("log_std", (spec.size,))] if spec.continuous else []

    def body(name: str) -> None:
        width = obs_dim
        for i, h in enumerate(list(hidden[:-1]) + [hidden[-1]]):
            out.extend([(f"{name}.{i}.weight", (h, width)), (f"{name}.{i}.bias", (h,))])
            width = h

    body("body")
    out += [("policy.weight", (spec.n_outputs, hidden[-1])), ("policy.bias", (spec.n_outputs,)),
            ("value.weight", (1, hidden[-1])), ("value.bias", (1,))]
    if not shared_torso:
        body("critic")
    return out


class MLPActorCritic:
    """The feed-forward MLP actor-critic in numpy, loaded from the broadcast's flat vector: ``hidden`` layers of
    ReLU (or tanh with ``agent.activation = "tanh"``), a policy head and a value head on the last (the value from a
    network of its own with ``agent.shared_torso = false``); observations of any shape are flattened into float32
    vectors after the job's normalisation, as :class:`~mpirl.agents.actor_critic.ActorCritic` does."""

    state_size = 0  # feed-forward: no core state

    def __init__(self, obs_shape: tuple[int, ...], action: ActionSpec | int, agent_cfg, obs_dtype=None):
        a = agent_cfg
        self.spec = as_spec(action)
        self.tanh = a.activation == "tanh"
        shapes = mlp_actor_critic_shapes(int(math.prod(obs_shape)), self.spec, list(a.hidden), a.shared_torso)
        self.flat, parts = flat_views([s for _, s in shapes])
        self.n_net = len(self.flat)
        views = dict(zip((name for name, _ in shapes), parts))
        layers = len(a.hidden)
        self.body = [(views[f"body.{i}.weight"], views[f"body.{i}.bias"]) for i in range(layers)]
        self.critic = (None if a.shared_torso else
                       [(views[f"critic.{i}.weight"], views[f"critic.{i}.bias"]) for i in range(layers)])
        self.policy = views["policy.weight"], views["policy.bias"]
        self.value = views["value.weight"], views["value.bias"]
        self._log_std = views.get("log_std")
        self.log_std: np.ndarray | None = None
        self.norm = normalization(obs_shape, a, obs_dtype=obs_dtype)
        self.n_params = self.n_net + self.norm.n_stats
        self._read_log_std()

    def _read_log_std(self) -> None:
        if self._log_std is not None:
            self.log_std = self._log_std.astype(np.float64)

    def load_flat(self, params: np.ndarray) -> None:
        if params.shape != (self.n_params,):
            raise ValueError(f"{params.shape[0]:,} values for a network and statistics of {self.n_params:,}")
        np.copyto(self.flat, params[:self.n_net])
        if self.norm.on:
            self.norm.load_stats(params[self.n_net:])
        self._read_log_std()

    def _inputs(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(self.norm.normalize(obs))
        return x.reshape(len(x), -1).astype(np.float32, copy=False)

    def _through(self, layers, x: np.ndarray) -> np.ndarray:
        for w, b in layers:
            x = x @ w.T + b
            x = np.tanh(x) if self.tanh else np.maximum(x, 0.0)
        return x

    def outputs(self, obs: np.ndarray) -> np.ndarray:
        """float64 ``(k, n_outputs)``: per observation, each categorical's log-probabilities or the means."""
        w, b = self.policy
        return policy_outputs(self.spec, self._through(self.body, self._inputs(obs)) @ w.T + b)

    def values(self, obs: np.ndarray, h: np.ndarray | None = None, c: np.ndarray | None = None) -> np.ndarray:
        """float32 ``(k,)``: V of each observation (``h``, ``c``: a recurrent policy's, unused here)."""
        x = self._inputs(obs)
        w, b = self.value
        return (self._through(self.body if self.critic is None else self.critic, x) @ w.T + b)[:, 0].astype(
            np.float32, copy=False)
