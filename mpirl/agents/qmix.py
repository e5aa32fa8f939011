"""QMIX over whole episodes, with TD(lambda) targets and optional MAC-PO loss weights.

The learner trains on batches of whole episodes (the record spec is ``episode_spec``),
as PyMARL/EPyMARL's QMIX does: one recurrent agent network shared by all agents,
a monotonic mixer whose weights come from hypernetworks over the global state, a
target copy of both refreshed every ``target_update`` train steps, double-Q targets.

MAC-PO (``loss_weights="macpo"``) weights each step's squared TD error by

    w = |Q_tot - y| * exp(-|Q_tot - Q*|) * f(pi),   f(pi) = 1 + sum_i prod_{j!=i} pi_j - n prod_j pi_j

where Q* is a feed-forward central mixer (WQMIX's "central" QMIX-ff) trained to the
same targets y and pi_j is agent j's softmax probability of the action it took. The
per-episode mean of w is what AccMER's weight table stores (``episode_weights``).

Nothing here knows about MPI or the config: plain arguments and ``QmixHyper``. The learner (optimizer, train step)
is :mod:`mpirl.agents.qmix_learner`; the networks are in
:mod:`mpirl.agents.qmix_networks`, an actor's epsilon-greedy copy in :mod:`mpirl.agents.qmix_policy`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from mpirl.agents.train_step import Fault



def episode_spec(n_agents: int, obs_shape: tuple[int, ...], obs_dtype, state_shape: tuple[int, ...], state_dtype,
                 n_actions: int, episode_limit: int) -> dict:
    """Field name -> (per-episode shape, dtype); every shape starts with the time axis T + 1 (T = episode_limit).

    Row t of ``actions``/``reward``/``terminated`` is the step taken at t; ``filled[t]`` says that step
    exists (t < the episode's length L). Rows ``obs``/``state``/``avail`` hold t = 0..L, row L being the
    state the episode ended in (a truncated episode bootstraps from it). ``terminated`` is true only at
    a real end of the game, never at truncation. Rows past the episode are padding (zeros).
    """
    t1, n = episode_limit + 1, n_agents
    return {
        "obs": ((t1, n, *tuple(obs_shape)), np.dtype(obs_dtype)),
        "state": ((t1, *tuple(state_shape)), np.dtype(state_dtype)),
        "avail": ((t1, n, n_actions), np.dtype(np.bool_)),
        "actions": ((t1, n), np.dtype(np.int64)),
        "reward": ((t1,), np.dtype(np.float32)),
        "terminated": ((t1,), np.dtype(np.bool_)),
        "filled": ((t1,), np.dtype(np.bool_)),
    }


@dataclass
class QmixHyper:
    """QMIX's hyperparameters; defaults are PyMARL/EPyMARL's unless said otherwise.

    * ``gamma`` 0.99, ``lr`` 5e-4, ``grad_clip`` 10, ``rnn_hidden`` 64, ``mixer_embed`` 32,
      ``hypernet_hidden`` 64 (two-layer hypernetworks), ``target_update`` 200, ``double_q``: PyMARL's
      qmix.yaml/default.yaml (its 200 counts episodes, one train step each; EPyMARL counts train steps).
    * ``td_lambda`` 0.6: pymarl2 (Hu et al., "Rethinking the implementation tricks ... of QMIX") trains
      QMIX on TD(lambda) targets with lambda 0.6; lambda = 0 gives PyMARL's one-step targets.
    * ``optimizer`` "adam": EPyMARL's QLearner and pymarl2 use Adam (pymarl2 found it markedly better
      than RMSprop for QMIX); "rmsprop" gives PyMARL's RMSprop(alpha 0.99, eps 1e-5).
    * ``loss_weights``: "none" (plain masked MSE) or "macpo"; ``central_hidden`` 256 is WQMIX's
      central mixing width. The central mixer has its own optimizer (same kind and lr) and its own
      gradient clip, so QMIX's update is the same with and without it.
    """
    gamma: float = 0.99
    td_lambda: float = 0.6
    lr: float = 5e-4
    optimizer: str = "adam"
    grad_clip: float = 10.0
    target_update: int = 200
    double_q: bool = True
    rnn_hidden: int = 64
    mixer_embed: int = 32
    hypernet_hidden: int = 64
    loss_weights: str = "none"
    central_hidden: int = 256

    def __post_init__(self):
        if self.optimizer not in ("adam", "rmsprop"):
            raise ValueError(f"optimizer must be 'adam' or 'rmsprop', not {self.optimizer!r}")
        if self.loss_weights not in ("none", "macpo"):
            raise ValueError(f"loss_weights must be 'none' or 'macpo', not {self.loss_weights!r}")
        if not 0.0 <= self.td_lambda <= 1.0:
            raise ValueError(f"td_lambda must lie in [0, 1], not {self.td_lambda}")
        if self.target_update < 1:
            raise ValueError(f"target_update must be at least 1, not {self.target_update}")


def central_loss(q_star: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                 count: torch.Tensor | None = None) -> torch.Tensor:
    """The central mixer's masked MSE to the QMIX targets (mean over the steps where ``mask``; over ``count`` steps
    when given: the whole batch's, of which this is a learner's part)."""
    err = torch.where(mask, q_star - targets, torch.zeros_like(q_star))
    return (err ** 2).sum() / (mask.sum().clamp_min(1) if count is None else count)


# ----------------------------------------------------------------------------------------------- targets, weights

def step_mask(terminated: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
    """Steps ``[B, T]`` that are real transitions: filled and not after a termination (PyMARL's mask)."""
    after_end = torch.cumsum(terminated.long(), dim=1) - terminated.long() > 0
    return filled & ~after_end


@torch.no_grad()
def td_lambda_targets(rewards: torch.Tensor, terminated: torch.Tensor, filled: torch.Tensor,
                      target_qtot: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """TD(lambda) targets ``[B, T]`` (the forward view, computed backwards like PyMARL's build_td_lambda_targets).

    ``rewards``, ``terminated``, ``filled``: ``[B, T]`` (rows 0..T-1 of the episode record);
    ``target_qtot`` ``[B, T+1]``: the target mixer's value of state t (t = 0..T). With L the episode's
    length, G_{L-1} = r + gamma * Q(s_L) unless the episode terminated there (then r alone), and
    G_t = r_t + gamma * ((1 - lam) Q(s_{t+1}) + lam G_{t+1}). A truncated episode thus bootstraps from
    its last state whatever L is (PyMARL's version does so only when L = T). Zero where not a step.
    """
    mask = step_mask(terminated, filled)
    B, T = rewards.shape
    zero = rewards.new_zeros(B)
    g = zero
    has_next = torch.zeros(B, dtype=torch.bool, device=rewards.device)
    out = []
    for t in range(T - 1, -1, -1):
        q_next = target_qtot[:, t + 1]
        ahead = torch.where(has_next, (1.0 - lam) * q_next + lam * g, q_next)
        g = torch.where(mask[:, t], rewards[:, t] + gamma * torch.where(terminated[:, t], zero, ahead), zero)
        has_next = mask[:, t]
        out.append(g)
    return torch.stack(out[::-1], dim=1)


def f_pi(pi: torch.Tensor) -> torch.Tensor:
    """MAC-PO's f(pi) = 1 + sum_i prod_{j!=i} pi_j - n prod_j pi_j over the last axis (agents), in [1, 2].

    Written as 1 + sum_i (1 - pi_i) prod_{j<i} pi_j prod_{j>i} pi_j with exclusive prefix and suffix
    products: no division, exact when some pi_j are 0. (The sum is the probability that exactly one
    agent deviates from the joint action, hence f <= 2.)
    """
    ones = torch.ones_like(pi[..., :1])
    prefix = torch.cumprod(torch.cat([ones, pi[..., :-1]], dim=-1), dim=-1)
    suffix = torch.cumprod(torch.cat([ones, pi.flip(-1)[..., :-1]], dim=-1), dim=-1).flip(-1)
    return 1.0 + (prefix * suffix * (1.0 - pi)).sum(dim=-1)


# ----------------------------------------------------------------------------------------------- learner

# The hyperparameters that feed each kind of non-finite batch (see QMixLearner.diagnose), as in dqn.FEEDS.
FEEDS = {"batch": ("env",),
         "parameters": ("lr", "grad_clip", "optimizer"),
         "q": ("lr", "grad_clip", "optimizer"),
         "targets": ("gamma", "td_lambda", "lr", "target_update"),
         "weights": ("loss_weights", "central_hidden", "lr"),
         "loss": ("lr", "grad_clip", "loss_weights"),
         "gradient": ("lr", "grad_clip", "optimizer", "loss_weights"),
         "peer": ()}  # another learner's part (train_step.Fault): that learner's message names the settings


def divergence(fault: Fault, hp: QmixHyper, in_a_row: int, steps: int, skipped: int) -> str:
    """Why a QMIX learner gives up: what was not finite in the last skipped batch and what feeds it."""
    settings = asdict(hp)
    feeds = ", ".join(f"{k}={settings[k]:g}" if isinstance(settings[k], float) else f"{k}={settings[k]}"
                      for k in FEEDS[fault.kind] if k in settings)
    what = "cannot train" if fault.kind in ("batch", "peer") else "has diverged"
    tail = (f"; the settings that feed it: {feeds}" if feeds else
            "" if fault.kind == "peer" else "; the environment gave it")
    return (f"the QMIX learner {what}: {in_a_row} batches in a row were not finite after train step {steps} "
            f"({skipped} skipped in all); in the last, {fault.detail}{tail}")
