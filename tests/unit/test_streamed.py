"""Streamed offload as a point holds it: the suite's ``offload`` key, the name, the id, the record, the
estimate beside the simulated step, and the record's verdict where its probes cannot vouch for it."""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.strategy import Recompute, checkpointing_name
from ckptbench.point.training import TrainSpec
from ckptbench.store.validate import record_problem
from ckptbench.suite.keys import SuiteError
from ckptbench.theory.memory.estimate import estimate, estimate_case
from ckptbench.theory.verdicts.checks import blind_spot, offload_kind_check
from tests.unit.test_strategies import cases, recorded  # one suite head and one record round trip


def test_streamed_is_a_value_of_the_offload_key_beside_false_and_true():
    got = cases('every_n_layers = [0, 1]\ncheckpoint_layers = [[0, 2]]\noffload = [false, true, "streamed"]')
    assert [c.strategy for c in got] == ["none", "full", "full+offload", "full+offload-streamed", "layers-0,2",
                                         "layers-0,2+offload", "layers-0,2+offload-streamed"]
    streamed = [c for c in got if c.recompute.offload]
    assert all(c.offload and c.recompute.offload == "streamed" for c in streamed)
    assert [c.recompute.layers for c in streamed] == [(), (0, 2)]
    assert len({c.id for c in got}) == len(got)


def test_points_without_streamed_offload_keep_their_ids():
    plain = cases('every_n_layers = [0, 2]\ncheckpoint_layers = [[1]]\nsac = ["off", "save-matmuls"]\n'
                  'offload = [false, true]')
    beside = cases('every_n_layers = [0, 2]\ncheckpoint_layers = [[1]]\nsac = ["off", "save-matmuls"]\n'
                   'offload = [false, true, "streamed"]')
    assert [c.id for c in plain] == [c.id for c in beside if not c.recompute.offload]
    # the ids these points had before a point could name its offload kind (computed on main before it)
    base = dict(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=32, offload=True)
    assert Case(**base, every_n_layers=2).id == "3decbbb7205e"
    assert Case(**base, recompute=Recompute(layers=(0, 2))).id == "d3385891e71a"
    assert Case(**base, every_n_layers=1, recompute=Recompute(sac="save-matmuls")).id == "8847f2cfa708"


@pytest.mark.parametrize("sweep, reason", [
    ('every_n_layers = [1]\noffload = ["pinned"]', "unknown offload 'pinned'; known: false, true, \"streamed\""),
    ('every_n_layers = [0]\noffload = ["streamed"]', "offload needs checkpointing"),
    ("every_n_layers = [1]\noffload = [1]", "values must be booleans, got 1"),
    ('every_n_layers = [1]\noffload = ["streamed", "streamed"]', "duplicate value 'streamed'"),
])
def test_a_wrong_offload_is_one_line_naming_its_key(sweep, reason):
    with pytest.raises(SuiteError) as err:
        cases(sweep)
    assert err.value.key == "sweep.offload" and reason in err.value.reason and "\n" not in str(err.value)


def test_names():
    assert checkpointing_name(1, True, Recompute(offload="streamed")) == "full+offload-streamed"
    assert checkpointing_name(0, True, Recompute(layers=(0, 1), sac="save-attention", offload="streamed")) == \
        "layers-0,1+sac-save-attention+offload-streamed"
    assert checkpointing_name(2, True, Recompute()) == "every-2+offload"


def test_a_streamed_point_round_trips_through_a_record_and_a_wrong_one_is_named():
    case = cases('checkpoint_layers = [[1, 3]]\noffload = ["streamed"]')[0]
    line = recorded(case, "layers-1,3+offload-streamed")
    assert Recompute.from_dict(case.recompute.to_dict()) == case.recompute
    assert "offload" not in Recompute(layers=(1,)).to_dict()  # the dict a layer set had before
    unknown = {**line, "case": {**line["case"], "recompute": {"layers": [1, 3], "sac": "", "offload": "zero"}}}
    assert "case.recompute.offload is 'zero', not one of streamed" == record_problem(unknown)
    alone = {**line, "case": {**line["case"], "offload": False}}
    assert "but case.offload is not true" in record_problem(alone)


def test_on_cuda_the_estimate_holds_one_prefetched_input_where_the_simulated_step_does():
    """Backward from the last checkpointed layer down to the one above the first holds the input of the
    checkpointed layer below, prefetched; the simulated step (fake tensors) emulates the same moves."""
    from ckptbench.theory.memory.simulate import simulate

    spec = preset("llama-tiny", attn="eager")
    one_input = 512 * 64 * 4
    for n, extra in ((2, one_input), (1, 0)):  # full: the peak is layer 0's backward, where nothing is prefetched
        plain = estimate(spec, 1, 512, n, True, device="cuda")
        streamed = estimate(spec, 1, 512, n, True, device="cuda", streamed=True)
        assert streamed.peak_bytes - plain.peak_bytes == extra
        sim = simulate(spec, 1, 512, n, True, device="cuda", recompute=Recompute(offload="streamed"))
        assert (sim.peak_bytes, sim.peak_phase) == (streamed.peak_bytes, streamed.peak_phase)
    # a layer's moments above the last checkpointed layer hold nothing prefetched yet
    every2 = estimate(spec, 1, 512, 2, True, device="cuda", streamed=True)
    base = estimate(spec, 1, 512, 2, True, device="cuda")
    assert every2.phases["backward-layer-3"] == base.phases["backward-layer-3"]
    assert every2.phases["backward-layer-2"]["activations"] - base.phases["backward-layer-2"]["activations"] == \
        one_input


def test_on_a_cpu_the_estimate_is_transformers_offloads():
    plain, streamed = (Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=256,
                            every_n_layers=2, offload=True, recompute=r) for r in (Recompute(), Recompute(offload="streamed")))
    assert estimate_case(plain).to_dict() == {**estimate_case(streamed).to_dict(), "offload_kind": ""}
    assert estimate_case(streamed).offload_kind == "streamed"


def test_estimate_takes_streamed_offload(capsys):
    from ckptbench.cli import estimate as cli

    argv = ["estimate", "--model", "llama-tiny", "--batch", "1", "--seq", "512", "--every-n-layers", "2",
            "--device", "cuda", "--dtype", "fp32", "--attn", "eager"]
    assert cli.main([*argv, "--offload"]) == 0
    plain = capsys.readouterr().out
    assert cli.main([*argv, "--offload-streamed"]) == 0
    streamed = capsys.readouterr().out
    assert "every_n_layers=2 offload-streamed" in streamed and "every_n_layers=2 offload " in plain
    peak = {name: int(next(line for line in out.splitlines() if line.startswith("peak (device)")).split()[-1]
                      .replace(",", "")) for name, out in (("plain", plain), ("streamed", streamed))}
    assert peak["streamed"] - peak["plain"] == 512 * 64 * 4  # the prefetched input of layer 0


def test_a_record_that_does_not_say_which_offload_ran_is_not_vouched_for():
    case = cases('every_n_layers = [1]\noffload = ["streamed"]')[0]
    said = offload_kind_check(case, {"offload_kind": "streamed"})
    other = offload_kind_check(case, {"offload_kind": "transformers"})
    silent = offload_kind_check(case, {})
    assert (said.verdict, other.verdict, silent.verdict) == ("pass", "fail", "skip")
    assert blind_spot(case, [said]) == "" and "does not say its hooks ran" in blind_spot(case, [silent])
    plain = cases("every_n_layers = [1]\noffload = [true]")[0]
    assert blind_spot(plain, [offload_kind_check(plain, {})]) == ""  # transformers' hooks are known by name


def test_reports_order_streamed_offload_last_and_pair_it_with_its_twin_without_offload():
    from ckptbench.report.columns import strategy_order
    from ckptbench.report.gpu_summary import offload_overheads

    names = ["full+offload-streamed", "full+offload", "none", "every-2+offload-streamed", "full"]
    assert sorted(names, key=strategy_order) == ["none", "full", "full+offload", "every-2+offload-streamed",
                                                 "full+offload-streamed"]
    plain, moved, streamed = (cases('every_n_layers = [1]\noffload = [false, true, "streamed"]'))
    records = [{"case_id": c.id, "case": c.to_dict(), "status": "ok", "strategy": c.strategy,
                "measurement": {"step_time_median_s": t, "offloaded_bytes": 1024}}
               for c, t in ((plain, 1.0), (moved, 1.5), (streamed, 1.25))]
    rows = {r["strategy"]: r for r in offload_overheads(records, None)}
    assert {r["twin_case_id"] for r in rows.values()} == {plain.id}
    assert rows["full+offload-streamed"]["overhead_s"] == 0.25 and rows["full+offload"]["overhead_s"] == 0.5
    assert (rows["full+offload-streamed"]["offload_kind"], rows["full+offload"]["offload_kind"]) == \
        ("streamed", "transformers")
