"""plan ranks SAC policies and streamed offload beside every n-th layer, and says what it cannot rank."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.strategy import Recompute
from ckptbench.point.training import TrainSpec
from ckptbench.theory.memory.estimate import estimate_case
from ckptbench.theory.memory.extrapolate import Simulated, extrapolation
from ckptbench.theory.memory.simulate import simulate
from ckptbench.theory.policy import plan as planner
from ckptbench.theory.policy.planstrategies import NOT_RANKED, PerStrategy, candidates
from ckptbench.theory.time.flops import hardware_flops_per_token
from ckptbench.theory.time.plantime import DatasheetTimer, depth_extrapolated, streamed_hidden_s, variants

SAC = "save-matmuls"


def _price(c: Case) -> float:
    """A step time affine in the depth and the checkpointed layers, a SAC layer dearer, an offload copy 2 s."""
    n = len(c.checkpointed_layers)
    return 7.0 + 3.0 * c.model.layers + (0.5 + 0.25 * bool(c.recompute.sac) + 2.0 * c.offload) * n


def test_a_layer_set_or_sac_point_is_carried_from_plain_and_one_checkpointed_layer():
    deep = Case(model=preset("llama-8b"), train=TrainSpec(), batch_size=2, seq_len=128,
                recompute=Recompute(layers=(0, 1, 5), sac=SAC))
    parts = [(v.model.layers, v.checkpointed_layers, v.recompute, w) for v, w in variants(deep)]
    # the plain steps checkpoint nothing (the set's indices are the deep model's), the checkpointed one keeps
    # the policy: a layer set of 3 is priced as 3 checkpointed layers of its policy
    assert parts == [(1, [], Recompute(), 2 - 32 - 3), (2, [], Recompute(), 31), (1, [0], Recompute(sac=SAC), 3)]
    assert depth_extrapolated(deep, _price) == pytest.approx(_price(deep))


def test_streamed_offload_hides_each_layers_copies_up_to_one_layers_compute():
    base = Case(model=preset("llama-8b"), train=TrainSpec(), batch_size=2, seq_len=128, every_n_layers=4,
                offload=True, device="cuda")
    streamed = replace(base, recompute=Recompute(offload="streamed"))
    # the copies of a checkpointed layer (2 s) against one layer's compute (3 s): all hidden, for each of 8
    assert streamed_hidden_s(streamed, _price) == pytest.approx(8 * 2.0)
    assert depth_extrapolated(streamed, _price) == pytest.approx(depth_extrapolated(base, _price) - 16.0)

    def slow_link(c: Case) -> float:
        return _price(c) + 4.0 * c.offload * len(c.checkpointed_layers)  # copies of 6 s: 3 s of each hidden

    assert streamed_hidden_s(streamed, slow_link) == pytest.approx(8 * 3.0)
    for other in (base, replace(streamed, device="cpu"), replace(streamed, offload=False)):
        assert streamed_hidden_s(other, _price) == 0.0


def test_the_fake_trace_runs_the_sac_policy():
    from ckptbench.theory.time.optrace import trace_case

    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=2, seq_len=32, every_n_layers=1)

    def recomputed_matmuls(c: Case) -> int:
        return sum(e["counts"]["recompute"] for e in trace_case(c) if e["kind"] == "matmul")

    # plain checkpointing runs every matmul of a layer again; save-matmuls keeps their outputs, none again
    assert recomputed_matmuls(case) > 0
    assert recomputed_matmuls(replace(case, recompute=Recompute(sac=SAC))) == 0


def test_the_candidates_add_streamed_offload_and_each_policy():
    plain = candidates(4)
    assert [(n, off) for n, off, _ in plain] == planner.strategies(4)
    streamed = candidates(4, streamed=True)
    assert [x for x in streamed if x[2].offload] == [(n, True, Recompute(offload="streamed")) for n in (1, 2, 3, 4)]
    both = candidates(4, sac=(SAC, "save-attention"))
    assert [(n, off, r.sac) for n, off, r in both[len(plain):]] == [
        (n, off, p) for p in (SAC, "save-attention") for n in (1, 2, 3, 4) for off in (False, True)]


@pytest.fixture(scope="module")
def sac_fit():
    """llama-tiny's plain and save-matmuls steps fitted from few-layer simulations at seq 64 (CPU)."""
    spec = preset("llama-tiny")
    return spec, Simulated(extrapolation(spec, 64, "cpu", offloads=(False,), across=False,
                                         recompute=Recompute(sac=SAC)))


@pytest.mark.slow
def test_the_sac_fit_is_the_full_depth_simulation_to_the_byte(sac_fit):
    spec, fitted = sac_fit
    deep = replace(spec, layers=7)
    for n, batch in ((1, 2), (3, 5)):
        case = Case(model=deep, train=TrainSpec(), batch_size=batch, seq_len=64, every_n_layers=n,
                    recompute=Recompute(sac=SAC))
        assert fitted.peak(case) == simulate(deep, batch, 64, n, recompute=Recompute(sac=SAC)).peak_bytes


@pytest.mark.slow
def test_plan_ranks_sac_with_the_others_and_its_largest_batch_is_the_simulated_boundary(sac_fit):
    spec, fitted = sac_fit
    deep = replace(spec, layers=6)
    predict = PerStrategy(planner.Analytic(), {SAC: fitted})
    none = Case(model=deep, train=TrainSpec(), batch_size=8, seq_len=64)
    a = planner.Assumptions(memory_bytes=planner.Analytic().peak(none), device="cpu")

    def timer(case: Case) -> float:  # seconds from the step's FLOPs, as a datasheet would give them
        return predict.flops(case)[0] / 1e11

    options = planner.plan(deep, 64, a, predict=predict, timer=timer, sac=(SAC,))
    by = {o.strategy: o for o in options}
    assert {"sac-save-matmuls", "every-2+sac-save-matmuls", "sac-save-matmuls+offload"} <= set(by)
    assert not any(o.sac for o in planner.plan(deep, 64, a, timer=timer))  # nothing asked, nothing added
    best = by["sac-save-matmuls"]
    assert best.sac == SAC and best.every_n_layers == 1
    # fits at its largest batch and not one above, by the full-depth simulation itself
    peak = simulate(deep, best.max_batch, 64, 1, recompute=Recompute(sac=SAC)).peak_bytes
    above = simulate(deep, best.max_batch + 1, 64, 1, recompute=Recompute(sac=SAC)).peak_bytes
    assert peak == best.peak_bytes <= a.memory_bytes < above
    # it keeps more than full checkpointing and recomputes less: a batch between none's and full's
    assert by["none"].max_batch < best.max_batch < by["full"].max_batch
    # save-matmuls runs no matmul again: no FLOP is recomputed (the simulation counted them; the formula agrees)
    assert best.recompute_flops_share == 0 < by["full"].recompute_flops_share
    sac_case = Case(model=deep, train=TrainSpec(), batch_size=best.max_batch, seq_len=64, every_n_layers=1,
                    recompute=Recompute(sac=SAC))
    formula = hardware_flops_per_token(deep, 64, 6, sac=SAC) * best.max_batch * 64
    assert predict.flops(sac_case)[0] == pytest.approx(formula, rel=1e-9)
    assert options == sorted(options, key=lambda o: (-(o.tokens_per_s or 0), -o.max_batch))


def test_the_analytic_estimate_refuses_a_sac_case_instead_of_ignoring_the_policy():
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=32, every_n_layers=1,
                recompute=Recompute(sac=SAC))
    with pytest.raises(ValueError, match="SAC policy save-matmuls"):
        planner.Analytic().peak(case)


def test_a_cuda_plan_ranks_streamed_offload_at_its_estimate():
    spec = preset("llama-8b", dtype="bf16", attn="sdpa")
    a = planner.Assumptions(memory_bytes=141 * 10**9, device="cuda", device_name="NVIDIA H200",
                            reserved_margin=planner.CUDA_RESERVED_MARGIN, context_bytes=planner.CUDA_CONTEXT_BYTES)
    timer = DatasheetTimer("NVIDIA H200")
    options = planner.plan(spec, 8192, a, timer=timer, streamed=True)
    by = {o.strategy: o for o in options}
    streamed, serial = by["full+offload-streamed"], by["full+offload"]
    assert streamed.offload_kind == "streamed" and serial.offload_kind == ""
    case = Case(model=spec, train=TrainSpec(), batch_size=streamed.max_batch, seq_len=8192, every_n_layers=1,
                offload=True, device="cuda", recompute=Recompute(offload="streamed"))
    assert streamed.peak_bytes == estimate_case(case).peak_bytes
    # its copies overlap compute: at the same batch it is faster than transformers' offload, never slower
    assert streamed.max_batch == serial.max_batch and streamed.step_s < serial.step_s
    assert [r.strategy for r in planner.merged(options) if "streamed" in r.strategy]  # shown as rows of their own


def _plan_cli(capsys, *extra):
    from ckptbench.cli import main as cli_main

    code = cli_main(["plan", "--model", "llama-tiny", "--seq", "256", *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_plan_says_what_it_does_not_rank(capsys):
    code, out, _ = _plan_cli(capsys, "--device", "h200", "--precision", "bf16", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["not_ranked"]["compile-budget"] == NOT_RANKED["compile-budget"]
    assert "--sac" in plan["not_ranked"]["sac"] and "offload-streamed" not in plan["not_ranked"]
    assert any(o["offload_kind"] == "streamed" for o in plan["options"])


@pytest.mark.parametrize("extra, reason", [
    (("--sac", "save-everything"), "unknown policy 'save-everything'"),
    (("--sac", SAC, "--verify"), "not with --verify"),
])
def test_sac_plans_refuse_what_they_cannot_answer_in_one_line(capsys, extra, reason):
    code, _, err = _plan_cli(capsys, "--device", "cpu", "--memory", "1GiB", *extra)
    assert code == 2 and reason in err and len(err.splitlines()) == 1


def test_a_measured_point_is_set_beside_its_own_strategys_prediction_not_a_policys_of_the_same_n():
    from ckptbench.point.case import Case, preset
    from ckptbench.point.training import TrainSpec
    from ckptbench.report.plan_section import predicted_vs_measured

    def option(name: str, peak: int) -> dict:
        return {"strategy": name, "every_n_layers": 1, "offload": False, "max_batch": 4, "peak_bytes": peak,
                "tokens_per_s": 10.0}

    plan = {"seq_len": 64, "options": [option("full", 100), option("sac-save-matmuls", 150)]}
    case = Case(model=preset("gpt2-tiny"), train=TrainSpec(), batch_size=4, seq_len=64, every_n_layers=1)
    records = [{"case_id": case.id, "strategy": name, "status": "ok", "case": case.to_dict(),
                "measurement": {"peak_bytes": 101, "tokens_per_s": 9.0}} for name in ("full", "sac-save-matmuls", "every-2")]
    rows = predicted_vs_measured(records, plan)
    assert [(r["point"], r["peak_pred"]) for r in rows] == [("full b=4", 100), ("sac-save-matmuls b=4", 150)]


def test_streamed_offload_is_left_out_where_the_plan_cannot_answer_it_and_says_why():
    from ckptbench.cli.plan import not_ranked, streams

    cuda = planner.Assumptions(memory_bytes=80 * 2**30, device="cuda", device_name="NVIDIA H200")
    assert streams(cuda, planner.Analytic()) and "offload-streamed" not in not_ranked(cuda, planner.Analytic(), ())
    assert "--verify" in not_ranked(cuda, planner.Analytic(), (), verify=True)["offload-streamed"]
    sharded = replace(cuda, world=2, sharding="fsdp")
    assert not streams(sharded, planner.ShardedAnalytic(2))
    assert "analytic estimate of one unsharded rank" in not_ranked(sharded, planner.ShardedAnalytic(2), ())["offload-streamed"]
    cpu = replace(cuda, device="cpu", device_name=None)
    assert "+offload to the byte" in not_ranked(cpu, planner.Analytic(), ())["offload-streamed"]


def test_the_plan_page_lists_what_the_plan_did_not_rank(tmp_path, capsys):
    page = tmp_path / "plan.html"
    code, _, _ = _plan_cli(capsys, "--device", "h200", "--precision", "bf16", "--html", str(page))
    html = page.read_text()
    assert code == 0 and "<p>Not ranked:</p>" in html and "<li>compile-budget: not ranked:" in html
