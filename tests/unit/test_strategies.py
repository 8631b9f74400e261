"""Strategies beyond every n-th layer: layer sets and SAC policies in a suite, in a Case and in a record."""

from __future__ import annotations

import json

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.strategy import Recompute, checkpointing_name
from ckptbench.point.training import TrainSpec
from ckptbench.store.validate import record_problem
from ckptbench.suite.keys import SuiteError
from ckptbench.suite.parse import parse_suite

HEAD = '[model]\npreset = "llama-tiny"\n[sweep]\nbatch_size = [1]\nseq_len = [32]\n'


def cases(sweep: str):
    return parse_suite(HEAD + sweep, "x.toml").cases


def recorded(case: Case, strategy: str) -> dict:
    """`case` as a record's line, read back: it validates and gives the same Case, id and name `strategy`."""
    line = json.loads(json.dumps({"case_id": case.id, "status": "ok", "case": case.to_dict()}))
    assert record_problem(line) is None
    back = Case.from_dict(line["case"])
    assert back == case and back.id == case.id and back.strategy == strategy
    return line


def test_layer_sets_sit_beside_every_n_layers_as_one_axis():
    got = cases("every_n_layers = [0, 2]\ncheckpoint_layers = [[0, 1, 3], [2]]\noffload = [false, true]")
    assert [c.strategy for c in got] == ["none", "every-2", "every-2+offload", "layers-0,1,3",
                                         "layers-0,1,3+offload", "layers-2", "layers-2+offload"]
    assert [c.checkpointed_layers for c in got if c.strategy.startswith("layers")] == [[0, 1, 3]] * 2 + [[2]] * 2
    assert all(c.every_n_layers == 0 for c in got if c.recompute.layers)
    assert len({c.id for c in got}) == len(got)
    # only layer sets named: no every_n point beside them (not even "none")
    assert [c.strategy for c in cases("checkpoint_layers = [[1]]")] == ["layers-1"]


def test_sac_crosses_with_what_checkpoints_and_leaves_out_nothing_checkpointed():
    got = cases('every_n_layers = [0, 1]\ncheckpoint_layers = [[3]]\nsac = ["off", "save-matmuls"]')
    assert [c.strategy for c in got] == ["none", "full", "sac-save-matmuls", "layers-3", "layers-3+sac-save-matmuls"]
    sac = [c for c in got if c.recompute.sac]
    assert [c.recompute.sac for c in sac] == ["save-matmuls"] * 2
    assert not any(c.analytic for c in sac)  # the simulation is a SAC point's estimate
    assert all(c.analytic for c in got if not c.recompute.sac)


def test_points_without_a_layer_set_or_policy_keep_their_ids():
    plain = cases("every_n_layers = [0, 2, 1]")
    beside = cases('every_n_layers = [0, 2, 1]\ncheckpoint_layers = [[1]]\nsac = ["off", "save-attention"]')
    assert [c.id for c in plain] == [c.id for c in beside if c.recompute == Recompute()]
    # the id this point had before a Case could hold a layer set or a SAC policy
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=32, every_n_layers=2,
                offload=True)
    assert case.id == "3decbbb7205e"


def test_a_strategy_round_trips_through_a_record():
    case = cases('checkpoint_layers = [[0, 2]]\nsac = ["save-matmuls"]\noffload = [true]')[0]
    line = recorded(case, "layers-0,2+sac-save-matmuls+offload")
    broken = {**line, "case": {**line["case"], "recompute": {"layers": ["0"], "sac": ""}}}
    assert "recompute.layers" in record_problem(broken)


@pytest.mark.parametrize("sweep, key, reason", [
    ("checkpoint_layers = [[0, 4]]", "sweep.checkpoint_layers", "layer 4 is out of range: the model's layers are 0..3"),
    ("checkpoint_layers = [[2, 1]]", "sweep.checkpoint_layers", "not in increasing order (write [1, 2])"),
    ("checkpoint_layers = [[1, 1]]", "sweep.checkpoint_layers", "names a layer twice"),
    ("checkpoint_layers = [[]]", "sweep.checkpoint_layers", "non-empty list"),
    ("checkpoint_layers = [0, 1]", "sweep.checkpoint_layers", "write [[0, 1]] for the one set"),
    ("checkpoint_layers = [[0], [0]]", "sweep.checkpoint_layers", "duplicate value [0]"),
    ("checkpoint_layers = [[0.5]]", "sweep.checkpoint_layers", "must be integers"),
    ('every_n_layers = [1]\nsac = ["save-everything"]', "sweep.sac", "unknown policy 'save-everything'; known: off,"),
    ('sac = ["save-matmuls"]', "sweep.sac", "a SAC policy applies inside checkpointed layers"),
    ("every_n_layers = [0]\noffload = [true]", "sweep.offload", "offload needs checkpointing"),
])
def test_a_wrong_strategy_is_one_line_naming_its_key(sweep, key, reason):
    with pytest.raises(SuiteError) as err:
        cases(sweep)
    assert err.value.key == key and reason in err.value.reason and "\n" not in str(err.value)


def test_names():
    assert checkpointing_name(0, False, Recompute(layers=(0, 1, 2, 5))) == "layers-0,1,2,5"
    assert checkpointing_name(1, True, Recompute(sac="save-attention")) == "sac-save-attention+offload"
    assert checkpointing_name(2, False, Recompute(sac="save-nothing")) == "every-2+sac-save-nothing"
    assert checkpointing_name(1, False) == "full" and checkpointing_name(0, False, Recompute()) == "none"


def test_estimate_takes_a_layer_set(capsys):
    from ckptbench.base.errors import UsageError
    from ckptbench.cli import estimate as cli

    assert cli.main(["estimate", "--model", "llama-tiny", "--batch", "1", "--seq", "1024", "--layers", "0,1,3",
                     "--device", "cpu", "--dtype", "fp32", "--attn", "eager"]) == 0
    out = capsys.readouterr().out
    assert "layers=0,1,3" in out and "80,891,364" in out  # the peak measured in tests/e2e/test_strategies.py
    for argv, message in ((["--layers", "0,4"], "--layers: layer 4 is out of range"),
                          (["--layers", "0,x"], "--layers: layer indices separated by commas"),
                          (["--layers", "0", "--every-n-layers", "2"], "--layers: give a layer set or"),
                          (["--every-n-layers", "1", "--sac", "save-all"], "--sac: unknown policy 'save-all'")):
        with pytest.raises(UsageError, match=message):
            cli.main(["estimate", "--model", "llama-tiny", "--batch", "1", "--seq", "64", "--device", "cpu", *argv])


def test_the_gpu_strategies_suite_sets_each_strategy_beside_none_at_each_length():
    """suites/strategies-gpu.toml, the device check's strategy suite: every strategy, without offload, with
    transformers' and with streamed offload, at both lengths, on CUDA; the points its header counts, each
    planned to fit the card."""
    from ckptbench.suite.parse import load_suite
    from ckptbench.theory.memory.estimate import estimate_case

    suite = load_suite("suites/strategies-gpu.toml")
    assert len(suite.cases) == 60 and {c.device for c in suite.cases} == {"cuda"}
    by_seq: dict[int, set[str]] = {}
    for c in suite.cases:
        by_seq.setdefault(c.seq_len, set()).add(c.strategy)
    assert set(by_seq) == {4096, 8192} and by_seq[4096] == by_seq[8192]
    names = by_seq[8192]
    assert "none" in names and "full+offload" in names and "layers-0…7+sac-save-matmuls+offload" in names
    assert {"full+offload-streamed", "every-4+offload-streamed", "layers-0…7+sac-save-attention+offload-streamed"} <= names
    assert {n.split("+")[0] for n in names} >= {"none", "every-4", "full", "layers-0…7", "sac-save-attention"}
    assert {"compile-budget-0", "compile-budget-1"} <= names  # torch.compile at both ends of the budget
    biggest = max((c for c in suite.cases if c.recompute.sac == "" and not c.compiled), key=lambda c: estimate_case(c).peak_bytes)
    assert biggest.strategy == "none" and estimate_case(biggest).peak_bytes < 33 * 2**30  # "32.0 GiB"
