"""K data-parallel DQN learners against one learner on the same batches, under mpiexec. Run by
``tests/test_learners.py``: ``mpiexec -n K python tests/learners_job.py OUT.json STEPS CASE...``, each CASE
``ALGO:BATCH``, ALGO ``dqn``, ``qmix`` or ``macpo`` (QMIX with MAC-PO's weights and central mixer: the learners sum
their steps and weights before the losses, and two optimizers' gradients); OUT maps each case to its results.

Each comparison runs twice, in float32 (the jobs' precision) and then in float64 (torch's default dtype set to it
before the learners are built, the batches' floats cast to it; the learners' gradient sum follows their
parameters' dtype): OUT holds ``{"float32": [...], "float64": [...]}``, each a list of the ranks' results. In float64
the K learners and the one agree to rounding (about 1e-16), so any real difference between them shows; in float32
they can part by ~1e-4 after a few steps on some CPUs, with no fault in the code: the part and the whole batch are
matrix products of different sizes, for which MKL picks different kernels (by CPU: ``MKL_CBWR``), a ReLU's input
within rounding of 0 then takes opposite signs in the two, and the gradient of that unit's weights for that row is
there in one and not in the other (a kink, not rounding), which Adam carries on.

Every rank makes the same stream of prioritized batches (fixed seed: observations, actions, rewards, discounts,
sampling probabilities); learner k trains rows [lo_k, hi_k) of each (:func:`mpirl.replay.quotas.learner_quotas`'s
cut) with :class:`mpirl.actor_learner.learner_peers.LearnerPeers` on ``COMM_WORLD``, its importance weights normalised by
the smallest probability over the learners (the control exchange's gather), as Ape-X's learner does. Rank 0 also
trains a reference learner alone on each whole batch. Out: every rank's final parameters' CRC and its |TD| of its
rows at the last step; rank 0 adds the largest difference between its parameters and the reference's, and between
the concatenated |TD| and the reference's. ALGO ``dqn-nan``, ``qmix-nan`` or ``macpo-nan``: no reference; at the
middle step the last learner's part has a NaN reward, and each rank reports which steps it skipped and why.
"""

from __future__ import annotations

import json
import sys
import traceback
from types import SimpleNamespace

import numpy as np
import torch
from mpi4py import MPI

from mpirl.agents.dqn import DQNLearner
from mpirl.replay.quotas import learner_quotas
from mpirl.replay.weights import importance_weights
from mpirl.actor_learner.learner_peers import LearnerPeers, smallest

OBS, ACTIONS = 4, 2
AGENT = SimpleNamespace(hidden=[32, 32], network="mlp", lr=1e-3, adam_eps=1.5e-4, grad_clip=10.0, target_update=5,
                        precision="fp32", gamma=0.99)


def floats(fields: dict) -> dict:
    """The batch's float fields in torch's default dtype (the learners' precision)."""
    want = torch.empty(0).numpy().dtype
    return {k: v.astype(want) if v.dtype.kind == "f" else v for k, v in fields.items()}


def batch(rng: np.random.Generator, n: int) -> tuple[dict, np.ndarray]:
    fields = {"obs": rng.standard_normal((n, OBS)).astype(np.float32),
              "next_obs": rng.standard_normal((n, OBS)).astype(np.float32),
              "action": rng.integers(0, ACTIONS, n).astype(np.int64),
              "reward": rng.standard_normal(n).astype(np.float32),
              "discount": np.full(n, 0.99 ** 3, np.float32), "done": rng.random(n) < 0.1}
    probs = rng.uniform(0.2, 1.0, n) / n
    return fields, probs


N_AGENTS, Q_ACTIONS, Q_STATES, LIMIT = 2, 4, 3, 3


def episodes(rng: np.random.Generator, n: int) -> dict:
    """Random episodes of a tiny two-agent game (1-3 steps, action 3 never available), QMIX's episode fields."""
    from mpirl.agents.qmix import episode_spec
    spec = episode_spec(N_AGENTS, (Q_STATES,), np.uint8, (Q_STATES,), np.float32, Q_ACTIONS, LIMIT)
    b = {k: np.zeros((n, *shape), dtype) for k, (shape, dtype) in spec.items()}
    lengths = rng.integers(1, LIMIT + 1, size=n)
    states = rng.integers(Q_STATES, size=(n, LIMIT + 1))
    for t in range(LIMIT + 1):
        onehot = np.eye(Q_STATES, dtype=np.uint8)[states[:, t]]
        live = t <= lengths
        b["obs"][:, t] = np.where(live[:, None, None], onehot[:, None, :], 0)
        b["state"][:, t] = np.where(live[:, None], onehot, 0)
        b["avail"][:, t, :, :3] = live[:, None, None]
        if t < LIMIT:
            step = t < lengths
            b["actions"][:, t] = np.where(step[:, None], rng.integers(3, size=(n, N_AGENTS)), 0)
            b["reward"][:, t] = np.where(step, rng.random(n), 0)
            b["filled"][:, t] = step
    b["terminated"][np.arange(n), lengths - 1] = rng.random(n) < 0.5
    return b


def qmix_main(n: int, steps: int, weights: str) -> dict:
    from mpirl.agents.qmix import QmixHyper
    from mpirl.agents.qmix_learner import QMixLearner
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    K, k = comm.size, comm.rank
    part = np.cumsum([0] + [sum(q) for q in learner_quotas([n], K)])
    lo, hi = int(part[k]), int(part[k + 1])
    hp = QmixHyper(rnn_hidden=16, mixer_embed=8, hypernet_hidden=16, central_hidden=32, loss_weights=weights,
                   target_update=5, lr=3e-3)

    def make():
        return QMixLearner(N_AGENTS, (Q_STATES,), (Q_STATES,), Q_ACTIONS, hp, seed=3)

    def everything(learner) -> np.ndarray:  # agent, mixer and (MAC-PO) central mixer
        nets = [learner.agent, learner.mixer] + ([learner.central] if learner.central is not None else [])
        return np.concatenate([torch.nn.utils.parameters_to_vector(m.parameters()).detach().numpy() for m in nets])
    mine, ref = make(), (make() if k == 0 else None)
    start = everything(mine)
    peers = LearnerPeers(comm, n)
    rng = np.random.default_rng(11)
    for step in range(steps):
        b = floats(episodes(rng, n))
        peers.control(False, False, 0.0, everything(mine) if step % 10 == 0 else None, step)
        stats = mine.train_step({name: v[lo:hi] for name, v in b.items()}, peers)
        assert not stats["skipped"], stats["reason"]
        if ref is not None:
            ref_stats = ref.train_step(b)
    ew = comm.gather(stats["episode_weights"].tolist(), root=0)
    result = {"rank": k, "rows": [lo, hi], "crc": int(peers.crc(everything(mine))), "steps": mine.steps}
    if ref is not None:
        result["param_diff"] = float(np.abs(everything(mine) - everything(ref)).max())
        result["param_scale"] = float(np.abs(everything(ref)).max())
        result["td_diff"] = float(np.abs(np.concatenate(ew) - ref_stats["episode_weights"]).max())
        result["loss_diff"] = abs(stats["loss"] - ref_stats["loss"])
        result["ref_steps"] = ref.steps
        result["moved"] = float(np.abs(everything(ref) - start).max())
    return result


def main(n: int, steps: int) -> dict:
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    K, k = comm.size, comm.rank
    part = np.cumsum([0] + [sum(q) for q in learner_quotas([n], K)])  # one shard: the cut of the batch alone
    lo, hi = int(part[k]), int(part[k + 1])
    mine = DQNLearner((OBS,), ACTIONS, AGENT, torch.device("cpu"), seed=3)
    ref = DQNLearner((OBS,), ACTIONS, AGENT, torch.device("cpu"), seed=3) if k == 0 else None
    peers = LearnerPeers(comm, n)
    rng = np.random.default_rng(11)
    beta = 0.4
    for step in range(steps):
        fields, probs = batch(rng, n)
        fields = floats(fields)
        own = {name: v[lo:hi] for name, v in fields.items()}
        ctl = peers.control(False, False, smallest(probs[lo:hi]), mine.flat_params() if step % 10 == 0 else None,
                            step)
        w = importance_weights(probs[lo:hi], n, beta, smallest=float(np.min(ctl.stats)))
        _, td = mine.train_step(own, w, peers)
        if ref is not None:
            _, td_ref = ref.train_step(fields, importance_weights(probs, n, beta))
    tds = comm.gather(td.tolist(), root=0)
    result = {"rank": k, "rows": [lo, hi], "crc": int(peers.crc(mine.flat_params())), "steps": mine.steps}
    if ref is not None:
        result["param_diff"] = float(np.abs(mine.flat_params() - ref.flat_params()).max())
        result["param_scale"] = float(np.abs(ref.flat_params()).max())
        result["td_diff"] = float(np.abs(np.concatenate(tds) - td_ref).max())
        result["ref_steps"] = ref.steps
        result["moved"] = float(np.abs(ref.flat_params() - DQNLearner((OBS,), ACTIONS, AGENT, torch.device("cpu"),
                                                                        seed=3).flat_params()).max())
    return result


def poisoned_main(n: int, steps: int, algo: str) -> dict:
    """``steps`` train steps of the learners alone; at the middle one the last learner's part has a NaN reward.
    Out: each step whether it was skipped, and the skipped step's fault (kind, detail) on this learner."""
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    K, k = comm.size, comm.rank
    part = np.cumsum([0] + [sum(q) for q in learner_quotas([n], K)])
    lo, hi = int(part[k]), int(part[k + 1])
    peers = LearnerPeers(comm, n)
    rng = np.random.default_rng(11)
    if algo == "dqn-nan":
        learner = DQNLearner((OBS,), ACTIONS, AGENT, torch.device("cpu"), seed=3)
    else:
        from mpirl.agents.qmix import QmixHyper
        from mpirl.agents.qmix_learner import QMixLearner
        hp = QmixHyper(rnn_hidden=16, mixer_embed=8, hypernet_hidden=16, central_hidden=32, target_update=5,
                       lr=3e-3, loss_weights="macpo" if algo == "macpo-nan" else "none")
        learner = QMixLearner(N_AGENTS, (Q_STATES,), (Q_STATES,), Q_ACTIONS, hp, seed=3)
    skipped, fault = [], None
    for step in range(steps):
        bad = step == steps // 2 and k == K - 1
        if algo == "dqn-nan":
            fields, probs = batch(rng, n)
            own = {name: v[lo:hi].copy() for name, v in fields.items()}
            if bad:
                own["reward"][0] = np.nan
            ctl = peers.control(False, False, smallest(probs[lo:hi]), None, step)
            _, td = learner.train_step(own, importance_weights(probs[lo:hi], n, 0.4, smallest=float(np.min(ctl.stats))),
                                       peers)
            skipped.append(td is None)
        else:
            b = episodes(rng, n)
            own = {name: v[lo:hi].copy() for name, v in b.items()}
            if bad:
                own["reward"][0, 0] = np.nan
            peers.control(False, False, 0.0, None, step)
            skipped.append(bool(learner.train_step(own, peers)["skipped"]))
        if skipped[-1]:
            fault = [learner.fault.kind, learner.fault.detail]
    return {"rank": k, "skipped": skipped, "fault": fault, "steps": learner.steps}


def run_case(case: str, steps: int):
    """One case ``ALGO:BATCH``: a comparison in both precisions, or a poisoned run (``ALGO`` ending in ``-nan``)."""
    algo, n = case.split(":")
    if algo.endswith("-nan"):
        return MPI.COMM_WORLD.gather(poisoned_main(int(n), steps, algo), root=0)
    res = {}
    for dtype in (torch.float32, torch.float64):
        torch.set_default_dtype(dtype)
        res[str(dtype).split(".")[1]] = MPI.COMM_WORLD.gather(
            main(int(n), steps) if algo == "dqn" else qmix_main(int(n), steps, "macpo" if algo == "macpo" else "none"),
            root=0)
    torch.set_default_dtype(torch.float32)
    return res


if __name__ == "__main__":
    out, steps, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    try:
        everyone = {case: run_case(case, steps) for case in cases}  # one mpiexec for several: its start-up once
    except Exception:  # noqa: BLE001 - the test reads the traceback from the output
        traceback.print_exc()
        MPI.COMM_WORLD.Abort(1)
    if MPI.COMM_WORLD.rank == 0:
        with open(out, "w") as f:
            json.dump(everyone, f)
