"""``mpirl bench gpu``: without CUDA it says so, names what it would measure and exits 0; its CPU rehearsal measures
every part; and its bare steps are fair: the same loss as ours on the same inputs, each pass of the network with
the same autograd mode as ours.

No timing is asserted (the machines are shared and noisy).
"""

import math

import h5py
import numpy as np
import pytest
import torch

from conftest import run_cli
from mpirl.bench import gpu, gpu_steps
from mpirl.bench import learner as apex
from mpirl.bench.report import format_rows, write_rows

cpu = torch.device("cpu")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the bench would measure")


@no_cuda
def test_without_cuda_it_names_what_it_would_run_and_exits_0(tmp_path, capsys):
    out = tmp_path / "b.h5"
    proc = run_cli("bench", "gpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("no CUDA: ") for line in lines) == 1, proc.stdout
    for line in gpu.plan(gpu.FULL):
        assert f"  - {line}" in lines, (line, proc.stdout)
    assert "failed" not in proc.stdout  # the suite does not count it as a failed bench
    with h5py.File(out, "r") as f:
        assert len(f["gpu"]) == 0  # no rows
    assert gpu.run(reps=1, seconds=0.01, device="cuda") == []
    assert capsys.readouterr().out.startswith("no CUDA: ")


def test_plan_names_every_part():
    text = "\n".join(gpu.plan(gpu.FULL))
    for what in ("Ape-X", "bf16", "IMPALA", "32 trajectories x 20 steps", "PPO", "128 steps x 8 games",
                 "frame cache", "inference worker"):
        assert what in text, what


def test_cpu_rehearsal_measures_every_part(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "TURNS", 1)
    rows = gpu.run(reps=1, seconds=0.01, device="cpu")
    names = [r.name for r in rows]
    for start in ("Ape-X learner step, Breakout Nature CNN, batch 8, cpu, fp32: ours vs bare",
                  "Ape-X learner step, Breakout Nature CNN, batch 8, cpu, bf16: ours vs bare",
                  "Ape-X learner step, Breakout Nature CNN, batch 8, cpu: ours bf16 vs ours fp32",
                  "IMPALA learner step, 2 trajectories x 3 steps, Nature CNN, cpu, fp32: ours vs bare",
                  "IMPALA learner step, 2 trajectories x 3 steps, Nature CNN, cpu: bare bf16 vs bare fp32",
                  "PPO update, 4 steps x 2 games, 1 epoch(s) x 2 minibatches, Nature CNN, cpu, fp32: ours vs bare",
                  "Ape-X train step with the frame cache on cpu vs without",
                  "inference worker forward pass, 2 observations (1 actors x 2 games): cpu vs CPU"):
        assert any(n.startswith(start) for n in names), (start, names)
    assert sum("samples per second" in n for n in names) == 4  # Ape-X fp32 and bf16, IMPALA, PPO
    for r in rows:
        assert len(r.values) == 2 and {r.ours, r.reference} == set(r.values), r.name
        for impl, values in r.values.items():
            assert values and all(math.isfinite(v) and v > 0 for v in values), (r.name, impl, values)
        assert np.isfinite(r.ratio) and r.ratio > 0, r.name
    cache = next(r for r in rows if "frame cache" in r.name)
    assert " cached, " in cache.note and " sent" in cache.note
    format_rows("gpu", rows)
    write_rows(tmp_path / "b.h5", "gpu", rows)
    with h5py.File(tmp_path / "b.h5", "r") as f:  # no "/" in a name: one group a row
        assert sorted(f["gpu"]) == sorted(names)


# -- fairness: the same loss, the same passes with the same autograd mode

def _passes(modules: dict, op) -> list[tuple]:
    """``(module, autograd on, rows)`` of every forward pass of ``modules`` during ``op()``, sorted."""
    seen: list[tuple] = []
    hooks = [m.register_forward_hook(lambda mod, args, out, name=name: seen.append(
        (name, torch.is_grad_enabled(), args[0].shape[0]))) for name, m in modules.items()]
    try:
        op()
    finally:
        for h in hooks:
            h.remove()
    return sorted(seen)


def test_apex_bare_step_is_ours_loss_and_passes():
    from mpirl.agents.tensors import to_tensors
    from mpirl.replay.weights import importance_weights
    obs = ((4, 84, 84), np.uint8)
    reply = apex._reply(obs, 4, capacity=128, batch=4)
    ours, bare, learner = apex.steps(obs, 4, [512], cpu, batch=4, reply=reply)
    nets = {"online": learner.agent.online, "target": learner.agent.target}
    got = _passes(nets, ours)
    assert got == _passes(nets, bare)
    assert got == [("online", False, 4), ("online", True, 4), ("target", False, 4)]  # targets without autograd
    views, fields, size = reply
    b = to_tensors({k: views[k] for k in fields}, cpu)
    w = torch.as_tensor(importance_weights(views["probs"], size, 0.4))
    a = learner.agent
    theirs = apex.bare_loss(a.online, a.target, b, w, b["discount"] * (~b["done"]).float())
    assert torch.allclose(theirs, a._forward(b, w)[2], rtol=1e-5, atol=1e-6)


def test_impala_bare_step_is_ours_loss_and_passes():
    from mpirl.agents.tensors import to_tensors
    ours, bare, _, training = gpu_steps.impala_steps(cpu, 2, 3)
    net = training.agent.net
    got = _passes({"net": net}, ours)
    assert got == _passes({"net": net}, bare) == [("net", True, 2 * 4)]  # one pass; V-trace without autograd
    b = to_tensors(gpu_steps.impala_batch(2, 3, seed=5), cpu)
    c, a = training.cfg.impala, training.cfg.agent
    theirs = gpu_steps.bare_impala_loss(net, b, a.gamma, c.rho_bar, c.c_bar, c.value_coef, c.entropy_coef)
    assert torch.allclose(theirs, training.agent.losses(b).total, rtol=1e-5, atol=1e-6)


def test_ppo_bare_update_is_ours_loss_and_passes():
    ours, bare, _, model = gpu_steps.ppo_steps(cpu, 4, 2, 1, 2)
    net = model.net
    got = _passes({"net": net}, ours)
    assert got == _passes({"net": net}, bare) == [("net", True, 4), ("net", True, 4)]  # a pass a minibatch
    p = model.prepare(gpu_steps.ppo_rollout(4, 2, seed=5))
    b = {k: getattr(p, k) for k in ("obs", "action", "logp")}
    ro = gpu_steps.ppo_rollout(4, 2, seed=5)
    t = {k: torch.as_tensor(getattr(ro, k)) for k in ("reward", "value", "bootstrap", "terminated")}
    adv, ret = gpu_steps.bare_gae(t["reward"], t["value"], t["bootstrap"], t["terminated"], 0.99, 0.95)
    assert torch.allclose(adv.flatten(), p.advantages, atol=1e-6)
    assert torch.allclose(ret.flatten(), p.returns, atol=1e-6)
    idx = np.array([0, 3, 5, 6])
    c = model.cfg
    theirs = gpu_steps.bare_ppo_loss(net, b["obs"][idx], b["action"][idx], b["logp"][idx], adv.flatten()[idx],
                               ret.flatten()[idx], model.clip, c.value_coef, model.entropy_coef)
    assert torch.allclose(theirs, model.losses(p, idx).total, rtol=1e-5, atol=1e-6)
