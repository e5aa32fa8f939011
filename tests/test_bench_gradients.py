"""``mpirl bench gradients`` runs end to end at a tiny scale and reports what it measured; its projection is
arithmetic that follows the cost model it states.

No timing is asserted (the machines are shared and noisy): the rows exist, hold finite positive values on every
side, and the allreduce rows carry their target.
"""

import math

import numpy as np
import pytest

from mpirl.bench import projection as proj
from mpirl.bench.report import format_rows, write_rows


def test_projection_follows_the_cost_model():
    eth, ib = proj.FABRICS
    S = 4_000_000
    # a ring of 2: two steps of half the buffer; of 1: nothing to exchange
    assert proj.ring_allreduce_s(S, 2, eth) == pytest.approx(2 * (eth.latency_s + S / 2 / eth.bytes_s))
    assert proj.ring_allreduce_s(S, 1, eth) == 0 and proj.ring_bytes_per_rank(S, 4) == pytest.approx(1.5 * S)
    c = proj.Costs(compute_s=0.01, apply_s=0.001, grad_bytes=S, message_bytes=S + 256, reply_bytes=S + 64)
    for ex in proj.EXCHANGES:
        effs = [proj.project(c, W, eth, ex).efficiency for W in proj.WORKERS]
        assert all(0 < e <= 1 for e in effs) and all(b <= a + 1e-12 for a, b in zip(effs, effs[1:])), (ex, effs)
        assert proj.project(c, 128, ib, ex).efficiency >= proj.project(c, 128, eth, ex).efficiency
    # the server's link caps the parameter server: at most one update per busy time, however many workers
    busy = proj.server_busy_s(c, eth)
    assert proj.project(c, 128, eth, "async").updates_s == pytest.approx(1 / busy)
    # allreduce: an update averages W gradients
    p = proj.project(c, 8, ib, "allreduce")
    assert p.gradients_s == pytest.approx(8 * p.updates_s) and p.speedup == pytest.approx(8 * p.efficiency)
    text = proj.table({"net": c}, workers=(8, 128))
    assert text.count("projected, not measured") == 1 + 2 * 2 * 2 and "107" in text


def test_stragglers_slow_a_lockstep_update_and_the_local_model_follows_its_formulas():
    samples = (0.010, 0.010, 0.010, 0.020)  # a rollout in four takes twice as long
    assert proj.lockstep_s(samples, 1) == pytest.approx(0.0125)  # one worker: the mean
    waits = [proj.lockstep_s(samples, W) for W in (2, 8, 128)]
    assert 0.0125 < waits[0] < waits[1] < waits[2] <= 0.020 and waits[2] == pytest.approx(0.020, rel=1e-3)
    eth = proj.FABRICS[0]
    c = proj.Costs(compute_s=0.0125, apply_s=0.001, grad_bytes=4000, message_bytes=4100, reply_bytes=4050)
    slow = proj.Costs(**{**c.__dict__, "compute_samples": samples})
    # the same mean compute, but an allreduce of 128 waits for its slowest: less efficient than without spread
    assert proj.project(slow, 128, eth, "allreduce").efficiency < proj.project(c, 128, eth, "allreduce").efficiency
    assert proj.project(slow, 128, eth, "async").efficiency == proj.project(c, 128, eth, "async").efficiency
    # on this machine: the largest of W computes and the exchange at a share of a core, then our ring
    assert proj.local_allreduce(samples, 0.001, 2, 0.5, 0.002) == pytest.approx(
        1 / ((proj.lockstep_s(samples, 2) + 0.001) / 0.5 + 0.002))
    # async: the workers' cycles bind while the cores have room, the cores' capacity once they do not
    assert proj.local_async(samples, 0.003, 2, 1.0, 0.001, 2.0) == pytest.approx(2 / (0.0125 + 0.003))
    assert proj.local_async(samples, 0.003, 8, 0.25, 0.001, 1.8) == pytest.approx(1.8 / (0.0125 + 0.001))
    assert proj.local_learners(0.3, 0.01) == pytest.approx(1 / 0.31)
    # the table names what an allreduce of its largest W waits for
    assert "the slowest of 128: 20 ms" in proj.table({"net": slow}, workers=(8, 128))
    assert "(no spread measured)" in proj.table({"net": c}, workers=(8, 128))


@pytest.mark.mpi
def test_gradients_bench_measures_the_allreduce_the_jobs_and_projects(capsys, tmp_path):
    from mpirl.bench import gradients
    rows = gradients.run(reps=1, seconds=0.01, ranks=(2,), workers=(1, 2), train_steps=30, learners=(1, 2),
                         learner_steps=150, step_batch=4, step_steps=1)
    printed = capsys.readouterr().out
    assert "projected, not measured" in printed and "DD-PPO" in printed
    allreduce = [r for r in rows if r.name.startswith("allreduce of the")]
    assert {r.name.split(" gradient")[0] for r in allreduce} == {"allreduce of the CartPole MLP",
                                                                 "allreduce of the Nature CNN"}
    for r in allreduce:
        assert r.target == 0.9 and set(r.values) == {gradients.OURS, gradients.BARE}
        assert np.isfinite(r.ratio) and r.ratio > 0
    jobs = [r for r in rows if r.name.startswith("a3c ")]
    for ex in ("async", "allreduce"):
        assert any(r.name.startswith(f"a3c {ex} job, 1 worker") and r.unit == "updates/s" for r in jobs)
        eff = next(r for r in jobs if r.name.startswith(f"a3c {ex} job, 2 workers") and "efficiency" in r.name)
        assert np.isfinite(eff.ratio) and eff.ratio > 0
    learners = [r for r in rows if r.name.startswith("apex job, ")]
    assert any(r.name.startswith("apex job, 1 learner (4 ranks): train step rate") for r in learners)
    vs = next(r for r in learners if r.name.startswith("apex job, 2 learners (5 ranks): train step rate vs 1"))
    # as many learner threads on both sides: 2 learners of one thread against one learner with two
    assert vs.name.endswith("vs 1 learner with 2 threads") and vs.reference == "1 learner, 2 threads"
    assert np.isfinite(vs.ratio) and vs.ratio > 0
    step = next(r for r in rows if r.name.startswith("Ape-X train step of the Nature CNN, batch 4, 2 learners vs 1"))
    assert step.name.endswith("2 learners vs 1 with 2 threads")
    assert (step.ours, step.reference) == ("2 learners x 1 thread", "1 learner x 2 threads")
    assert step.target == 0.9 and np.isfinite(step.ratio) and step.ratio > 0
    threads = next(r for r in rows
                   if r.name == "Ape-X train step of the Nature CNN, batch 4, 1 learner: 2 threads vs 1")
    assert threads.values["1 learner x 2 threads"] == step.values["1 learner x 2 threads"]  # the same runs
    assert np.isfinite(threads.ratio) and threads.ratio > 0
    # the scaling model against the jobs it predicts, within 20 %: the a3c jobs with 2 workers, the learners' step
    checked = {r.name: r for r in rows if r.name.startswith("scaling model vs measured: ")}
    assert set(checked) == {"scaling model vs measured: a3c allreduce job, 2 workers",
                            "scaling model vs measured: a3c async job, 2 workers",
                            "scaling model vs measured: Ape-X train step of the Nature CNN, batch 4, 1 learner",
                            "scaling model vs measured: Ape-X train step of the Nature CNN, batch 4, 2 learners"}
    for r in checked.values():
        assert r.within == 0.2 and (r.ours, r.reference) == ("model", "measured") and np.isfinite(r.ratio), r
    assert "the server busy" in checked["scaling model vs measured: a3c async job, 2 workers"].note
    assert "target: within 20 %" in format_rows("gradients", rows)
    projected = [r for r in rows if r.name.startswith("projected, not measured")]
    assert len(projected) == 2 * len(proj.FABRICS) * len(proj.EXCHANGES)
    for r in rows:
        for impl, values in r.values.items():
            assert values and all(math.isfinite(v) and v > 0 for v in values), (r.name, impl, values)
    assert "target >= 0.9x" in format_rows("gradients", rows)
    write_rows(tmp_path / "b.h5", "gradients", rows)
    import h5py
    with h5py.File(tmp_path / "b.h5", "r") as f:  # no "/" in a name: one group a row, one dataset a side
        assert sorted(f["gradients"]) == sorted(r.name for r in rows)
        assert all(sorted(f["gradients"][r.name]) == sorted(r.values) for r in rows)
