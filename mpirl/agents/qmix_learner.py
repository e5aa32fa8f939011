"""QMIX's learner: its networks and their target copies, the optimizer, one train step on a batch of whole episodes
(TD(lambda) targets, optional MAC-PO weights with the central mixer) and its checkpoint state. The losses and targets
it uses are the pure functions of :mod:`mpirl.agents.qmix`."""

from __future__ import annotations

import copy
from dataclasses import asdict

import numpy as np
import torch

from mpirl.agents.optimizers import Adam, RMSprop
from mpirl.agents.tensors import floats
from mpirl.agents.train_step import Fault, GradientPeers
from mpirl.agents.qmix import QmixHyper, central_loss, episode_spec, f_pi, step_mask, td_lambda_targets
from mpirl.agents.qmix_networks import (AgentNet, CentralMixer, QMixer, agent_inputs, last_action_onehot,
                                        mask_unavailable)
from mpirl.agents.qmix_policy import agent_input_dim


def _not_finite(t: torch.Tensor) -> int:
    return int((~torch.isfinite(t)).sum())


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = int(mask.sum())
    return float(torch.where(mask, x, torch.zeros_like(x)).sum()) / n if n else float("nan")


class QMixLearner:
    """QMIX's networks, optimizers and one train step on a batch of whole episodes.

    ``n_agents`` agents with observations ``obs_shape`` (flattened) and ``n_actions`` actions each,
    global state ``state_shape``. The central mixer (MAC-PO's Q*) is built and trained only with
    ``loss_weights="macpo"``; with "none" ``central_loss``, ``w_mean_raw`` and ``f_mean`` are nan.
    """

    def __init__(self, n_agents: int, obs_shape, state_shape, n_actions: int, hp: QmixHyper | None = None,
                 device: torch.device | str = "cpu", seed: int = 0):
        self.hp = hp = hp or QmixHyper()
        self.n_agents, self.n_actions = n_agents, n_actions
        self.obs_dim = int(np.prod(obs_shape))
        self.state_dim = int(np.prod(state_shape))
        self.device = torch.device(device)
        torch.manual_seed(seed)
        in_dim = agent_input_dim(self.obs_dim, n_actions, n_agents)
        self.agent = AgentNet(in_dim, n_actions, hp.rnn_hidden).to(self.device)
        self.mixer = QMixer(n_agents, self.state_dim, hp.mixer_embed, hp.hypernet_hidden).to(self.device)
        self.target_agent = AgentNet(in_dim, n_actions, hp.rnn_hidden).to(self.device)
        self.target_mixer = QMixer(n_agents, self.state_dim, hp.mixer_embed, hp.hypernet_hidden).to(self.device)
        self._update_targets()
        self.target_agent.requires_grad_(False)
        self.target_mixer.requires_grad_(False)
        self.params = list(self.agent.parameters()) + list(self.mixer.parameters())
        self.optimizer = self._optimizer(self.params)
        self.central = None
        self.central_optimizer = None
        if hp.loss_weights == "macpo":
            self.central = CentralMixer(n_agents, self.state_dim, hp.central_hidden).to(self.device)
            self.central_optimizer = self._optimizer(self.central.parameters())
        self.steps = 0
        self.skipped_batches = 0
        self.fault: Fault | None = None  # why the last skipped batch was skipped
        self.n_params = sum(p.numel() for p in self.agent.parameters())

    def _optimizer(self, params):
        if self.hp.optimizer == "rmsprop":
            return RMSprop(params, lr=self.hp.lr, alpha=0.99, eps=1e-5)
        return Adam(params, lr=self.hp.lr)  # torch's, started without torch._dynamo (mpirl.agents.optimizers)

    def _update_targets(self) -> None:
        self.target_agent.load_state_dict(self.agent.state_dict())
        self.target_mixer.load_state_dict(self.mixer.state_dict())

    # ---- forward pieces
    def _tensors(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        b = {k: torch.as_tensor(batch[k], device=self.device)
             for k in ("obs", "state", "avail", "actions", "reward", "terminated", "filled")}
        B, T1 = b["actions"].shape[:2]
        b["obs"] = b["obs"].reshape(B, T1, self.n_agents, self.obs_dim)
        b["state"] = floats(b["state"].reshape(B, T1, self.state_dim))
        b["avail"] = b["avail"].bool()
        b["terminated"] = b["terminated"].bool()
        b["filled"] = b["filled"].bool()
        b["reward"] = floats(b["reward"])
        b["inputs"] = agent_inputs(b["obs"], last_action_onehot(b["actions"], self.n_actions))
        return b

    def _agent_q(self, net: AgentNet, inputs: torch.Tensor) -> torch.Tensor:
        """[B, T+1, n, D] -> Q [B, T+1, n, A] (each agent's episode is one sequence)."""
        B, T1, n, D = inputs.shape
        q = net.sequence(inputs.transpose(1, 2).reshape(B * n, T1, D))
        return q.view(B, n, T1, -1).transpose(1, 2)

    def _forward(self, b: dict[str, torch.Tensor], peers: GradientPeers | None = None) -> dict[str, torch.Tensor]:
        """Q-values, targets and the losses. With ``peers`` (data-parallel learners, this batch a part of theirs)
        the means run over the whole batch's real steps, and MAC-PO's weights are normalised by the whole batch's
        mean: the counts and the weights' sum are summed over the learners first."""
        hp = self.hp
        actions, avail = b["actions"], b["avail"]
        q_all = self._agent_q(self.agent, b["inputs"])                                   # [B, T+1, n, A]
        chosen = q_all[:, :-1].gather(3, actions[:, :-1].unsqueeze(3)).squeeze(3)       # [B, T, n]
        with torch.no_grad():
            q_targ = mask_unavailable(self._agent_q(self.target_agent, b["inputs"]), avail)
            if hp.double_q:
                greedy = mask_unavailable(q_all.detach(), avail).argmax(dim=3, keepdim=True)
                q_max = q_targ.gather(3, greedy).squeeze(3)
            else:
                q_max = q_targ.max(dim=3).values
            target_qtot = self.target_mixer(q_max, b["state"])                            # [B, T+1]
            y = td_lambda_targets(b["reward"][:, :-1], b["terminated"][:, :-1], b["filled"][:, :-1],
                                  target_qtot, hp.gamma, hp.td_lambda)
        q_tot = self.mixer(chosen, b["state"][:, :-1])                                   # [B, T]
        mask = step_mask(b["terminated"][:, :-1], b["filled"][:, :-1])
        count = mask.sum().clamp_min(1)
        td = torch.where(mask, q_tot - y, torch.zeros_like(q_tot))
        out = {"q_all": q_all, "chosen": chosen, "q_tot": q_tot, "y": y, "mask": mask, "td": td}
        if self.central is None:
            if peers is not None:
                count = torch.as_tensor(peers.sum_values([float(mask.sum())])[0], device=td.device).clamp_min(1)
            out["loss"] = (td ** 2).sum() / count
            return out
        q_star = self.central(chosen.detach(), b["state"][:, :-1])
        out["q_star"] = q_star
        with torch.no_grad():
            logits = mask_unavailable(q_all[:, :-1].detach(), avail[:, :-1], float("-inf"))
            pi = torch.softmax(logits, dim=3).gather(3, actions[:, :-1].unsqueeze(3)).squeeze(3)
            f = f_pi(pi)
            w_raw = td.abs() * torch.exp(-(q_tot.detach() - q_star.detach()).abs()) * f
            w_raw = torch.where(mask, w_raw, torch.zeros_like(w_raw))
            w_sum = w_raw.sum()
            if peers is not None:  # the whole batch's steps and weights
                both = peers.sum_values([float(mask.sum()), float(w_sum)])
                count = torch.as_tensor(both[0], device=td.device).clamp_min(1)
                w_sum = torch.as_tensor(both[1], device=td.device, dtype=w_raw.dtype)
            w = w_raw / (w_sum / count).clamp_min(1e-12)
        out["central_loss"] = central_loss(q_star, y, mask, count if peers is not None else None)
        out.update(f=f, w_raw=w_raw)
        out["loss"] = (w * td ** 2).sum() / count
        return out

    # ---- the step
    def train_step(self, batch: dict[str, np.ndarray], peers: GradientPeers | None = None) -> dict:
        """One gradient step on a batch of ``B`` whole episodes (``episode_spec`` fields, ``[B, T+1, ...]``).

        Returns the stats ``loss``, ``td_abs`` (mean |Q_tot - y| over real steps), ``q_tot``,
        ``central_loss``, ``w_mean_raw``, ``f_mean``, ``grad_norm`` (QMIX's, before clipping),
        ``skipped`` and ``episode_weights`` (float64 ``[B]``): each episode's mean raw MAC-PO weight over
        its steps, or with ``loss_weights="none"`` its mean |TD| (so a weighted sampler still has a score).
        With ``peers`` (:class:`mpirl.actor_learner.learner_peers.LearnerPeers`) the batch is this learner's part of the
        learners' batch: the step every learner takes is the one a single learner takes on the whole batch.
        A batch whose loss or gradient is not finite is skipped: no step, ``skipped_batches`` + 1,
        ``skipped=True``, ``reason`` says what was not finite (``self.fault`` too) and
        ``episode_weights`` is None (keep the old weights).
        """
        b = self._tensors(batch)
        out = self._forward(b, peers)
        loss = out["loss"]
        closs = out.get("central_loss")
        self.optimizer.zero_grad(set_to_none=True)
        if self.central_optimizer is not None:
            self.central_optimizer.zero_grad(set_to_none=True)
        (loss + closs if closs is not None else loss).backward()
        if peers is not None:  # every learner's gradients and losses summed: the whole batch's, on each of them
            if closs is None:
                loss, = peers.sum_grads(self.params, loss)
            else:
                loss, closs = peers.sum_grads(self.params + list(self.central.parameters()), loss, closs)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.hp.grad_clip)
        finite = bool(torch.isfinite(loss)) and bool(torch.isfinite(norm))
        if closs is not None:
            cnorm = torch.nn.utils.clip_grad_norm_(self.central.parameters(), self.hp.grad_clip)
            finite = finite and bool(torch.isfinite(closs)) and bool(torch.isfinite(cnorm))
        mask = out["mask"]
        stats = {"loss": float(loss.detach()),
                 "td_abs": _masked_mean(out["td"].detach().abs(), mask),
                 "q_tot": _masked_mean(out["q_tot"].detach(), mask),
                 "central_loss": float(closs.detach()) if closs is not None else float("nan"),
                 "w_mean_raw": _masked_mean(out["w_raw"], mask) if "w_raw" in out else float("nan"),
                 "f_mean": _masked_mean(out["f"], mask) if "f" in out else float("nan"),
                 "grad_norm": float(norm)}
        if not finite:
            whose = peers.others_part() if peers is not None else ""
            self.fault = Fault("peer", whose) if whose else self.diagnose(b, out)
            self.optimizer.zero_grad(set_to_none=True)
            if self.central_optimizer is not None:
                self.central_optimizer.zero_grad(set_to_none=True)
            self.skipped_batches += 1
            return {**stats, "skipped": True, "reason": f"{self.fault.kind}: {self.fault.detail}",
                    "episode_weights": None}
        self.optimizer.step()
        if self.central_optimizer is not None:
            self.central_optimizer.step()
        self.steps += 1
        if self.steps % self.hp.target_update == 0:
            self._update_targets()
        per_step = out["w_raw"] if "w_raw" in out else out["td"].detach().abs()
        steps = mask.sum(dim=1)
        ew = (per_step.sum(dim=1) / steps.clamp_min(1)).double().cpu().numpy()
        return {**stats, "skipped": False, "reason": "", "episode_weights": ew}

    def diagnose(self, b: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> Fault:
        """What was not finite in a skipped batch, walking from its inputs to the gradient."""
        mask = out["mask"]
        n = int(mask.sum())
        reward = torch.where(mask, b["reward"][:, :-1], torch.zeros_like(b["reward"][:, :-1]))
        if _not_finite(reward):
            return Fault("batch", f"{_not_finite(reward)} of the batch's {n} rewards were not finite")
        for name in ("obs", "state"):
            if b[name].is_floating_point() and _not_finite(b[name]):
                return Fault("batch", f"{_not_finite(b[name])} of the batch's {name} values were not finite")
        nets = [("agent", self.agent), ("mixer", self.mixer), ("target agent", self.target_agent),
                ("target mixer", self.target_mixer)] + ([("central mixer", self.central)] if self.central else [])
        for label, net in nets:
            bad = [k for k, p in net.named_parameters() if _not_finite(p.detach())]
            if bad:
                return Fault("parameters", f"the {label} network's parameters were not finite ({', '.join(bad)})")
        for key, what in (("q_all", "agents' Q-values"), ("q_tot", "mixed Q_tot values")):
            x = out[key].detach()
            if key == "q_tot":
                x = torch.where(mask, x, torch.zeros_like(x))
            if _not_finite(x):
                return Fault("q", f"{_not_finite(x)} of the {what} were not finite (parameters finite)")
        y = out["y"]
        if _not_finite(y):
            return Fault("targets", f"{_not_finite(y)} of the {n} TD(lambda) targets were not finite "
                                    f"(rewards up to {float(reward.abs().max()):g}, parameters finite)")
        if "q_star" in out:
            for key, what in (("q_star", "central mixer's Q* values"), ("w_raw", "MAC-PO weights")):
                x = torch.where(mask, out[key].detach(), torch.zeros_like(out[key].detach()))
                if _not_finite(x):
                    return Fault("weights", f"{_not_finite(x)} of the {n} {what} were not finite")
        for key, what in (("loss", "loss"), ("central_loss", "central mixer's loss")):
            if key in out and not torch.isfinite(out[key]):
                return Fault("loss", f"the {what} was {float(out[key].detach()):g} though its inputs were finite "
                                     f"(|TD| up to {float(out['td'].detach().abs().max()):g})")
        norms = {}
        for label, net in nets[:2] + nets[4:]:
            for k, p in net.named_parameters():
                if p.grad is not None:
                    norms[f"{label}.{k}"] = float(torch.linalg.vector_norm(p.grad))
        bad = [f"{k} ({v:g})" for k, v in norms.items() if not np.isfinite(v)]
        if bad:
            return Fault("gradient", f"the gradient norm of {', '.join(bad)} was not finite")
        return Fault("gradient", "the gradient's total norm overflowed (per parameter finite)")

    # ---- parameters, checkpoints
    def flat_params(self) -> np.ndarray:
        """The agent network's parameters (all the actors need) as one float32 numpy vector."""
        return torch.nn.utils.parameters_to_vector(self.agent.parameters()).detach().float().cpu().numpy()

    def state_dict(self) -> dict:
        """Everything a checkpoint needs: all networks, optimizers, counters and the hyperparameters.

        A deep copy: a snapshot that later train steps do not change (torch's optimizer state dicts hold
        the live moment tensors, and loading one on the same device would share them).
        """
        sd = {"agent": self.agent.state_dict(), "mixer": self.mixer.state_dict(),
              "target_agent": self.target_agent.state_dict(), "target_mixer": self.target_mixer.state_dict(),
              "optimizer": self.optimizer.state_dict(), "steps": self.steps,
              "skipped_batches": self.skipped_batches, "hp": asdict(self.hp)}
        if self.central is not None:
            sd["central"] = self.central.state_dict()
            sd["central_optimizer"] = self.central_optimizer.state_dict()
        return copy.deepcopy(sd)

    def load_state_dict(self, sd: dict) -> None:
        self.agent.load_state_dict(sd["agent"])
        self.mixer.load_state_dict(sd["mixer"])
        self.target_agent.load_state_dict(sd["target_agent"])
        self.target_mixer.load_state_dict(sd["target_mixer"])
        self.optimizer.load_state_dict(sd["optimizer"])
        if self.central is not None:
            if "central" not in sd:
                raise ValueError("the checkpoint has no central mixer (it was trained with loss_weights='none')")
            self.central.load_state_dict(sd["central"])
            self.central_optimizer.load_state_dict(sd["central_optimizer"])
        self.steps = int(sd["steps"])
        self.skipped_batches = int(sd["skipped_batches"])
