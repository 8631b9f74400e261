"""The compile-budget strategy as data: torch.compile at an activation memory budget, in a suite, a Case
and a record (the compiled steps themselves: tests/e2e/test_compile_budget.py)."""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import Setup
from ckptbench.point.strategy import Recompute, checkpointing_name
from ckptbench.point.training import TrainSpec
from ckptbench.store.validate import record_problem
from ckptbench.suite.keys import SuiteError
from ckptbench.train.support import refusal
from tests.unit.test_strategies import cases, recorded  # one suite head and one record round trip


def test_each_budget_is_one_point_beside_the_other_strategies_and_crosses_with_none_of_them():
    got = cases('every_n_layers = [0, 1]\nsac = ["off", "save-matmuls"]\noffload = [false, true]\n'
                "compile_budget = [0, 0.25, 1]")
    assert [c.strategy for c in got] == ["none", "full", "full+offload", "sac-save-matmuls",
                                         "sac-save-matmuls+offload", "compile-budget-0", "compile-budget-0.25",
                                         "compile-budget-1"]
    compiled = [c for c in got if c.compiled]
    assert [c.recompute.compile_budget for c in compiled] == [0.0, 0.25, 1.0]
    # the partitioner decides: nothing checkpointed through transformers, no policy, no offload
    assert all(c.every_n_layers == 0 and not c.offload and c.recompute.sac == "" and not c.checkpointed_layers
               for c in compiled)
    assert not any(c.analytic for c in compiled)  # no estimate models the compiled program
    assert len({c.id for c in got}) == len(got)
    # only budgets named: the eager "none" point stays beside them
    assert [c.strategy for c in cases("compile_budget = [0.5]")] == ["none", "compile-budget-0.5"]


def test_eager_points_keep_their_ids():
    # the ids these points had before a Case could hold a compile budget (computed on main before it)
    plain = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=32, every_n_layers=2,
                 offload=True)
    sac = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=32,
               recompute=Recompute(layers=(0, 2), sac="save-matmuls"))
    assert (plain.id, sac.id) == ("3decbbb7205e", "0e12fb9b60bc")
    assert "compile_budget" not in sac.to_dict()["recompute"]
    assert Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=32,
                recompute=Recompute(compile_budget=0.5)).id not in (plain.id, sac.id)


def test_a_compile_point_round_trips_through_a_record():
    case = cases("compile_budget = [0.75]")[1]
    line = recorded(case, "compile-budget-0.75")
    for bad, reason in ((1.5, "outside [0, 1]"), ("half", "must be a number")):
        broken = {**line, "case": {**line["case"], "recompute": {"compile_budget": bad}}}
        assert "recompute.compile_budget" in record_problem(broken) and reason in record_problem(broken)


@pytest.mark.parametrize("values, reason", [
    ("[1.5]", "1.5 is outside [0, 1]"),
    ("[-0.25]", "-0.25 is outside [0, 1]"),
    ('["0.5"]', "number"),
    ("[true]", "number"),
    ("[0.5, 0.5]", "duplicate value 0.5"),
])
def test_a_wrong_budget_is_one_line_naming_sweep_compile_budget(values, reason):
    with pytest.raises(SuiteError) as err:
        cases(f"compile_budget = {values}")
    assert err.value.key == "sweep.compile_budget" and reason in err.value.reason and "\n" not in str(err.value)


def test_names():
    assert checkpointing_name(0, False, Recompute(compile_budget=0.5)) == "compile-budget-0.5"
    assert checkpointing_name(0, False, Recompute(compile_budget=0.0)) == "compile-budget-0"
    assert checkpointing_name(0, False, Recompute(compile_budget=1.0)) == "compile-budget-1"


@pytest.mark.parametrize("setup, world_size, named", [
    (Setup(loop="trainer"), 1, "trainer loop"),
    (Setup(loop="accelerate"), 1, "accelerate loop"),
    (Setup(), 2, "more than one rank"),
])
def test_a_compiled_point_outside_the_plain_loop_is_refused_with_its_reason(setup, world_size, named):
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=32, setup=setup,
                world_size=world_size, recompute=Recompute(compile_budget=0.5))
    why = refusal(case)
    assert why is not None and named in why and "torch.compile" in why
    assert refusal(Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=32,
                        recompute=Recompute(compile_budget=0.5))) is None
