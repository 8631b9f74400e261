"""plan --layer-sets: the best set of k layers for the counts every_n_layers cannot give, chosen by the estimate."""

from __future__ import annotations

from ckptbench.point.case import preset
from ckptbench.theory.memory.estimate import estimate
from ckptbench.theory.memory.layersets import best_set, candidates, every_n_counts, layer_set_strategies
from ckptbench.theory.policy import plan as planner


def test_the_counts_every_n_layers_reaches():
    assert every_n_counts(32) == {32, 16, 11, 8, 7, 6, 5, 4, 3, 2, 1}
    assert every_n_counts(4) == {4, 2, 1}
    assert candidates(32, 3) == [(0, 1, 2), (0, 11, 21), (29, 30, 31)]
    assert candidates(4, 4) == [(0, 1, 2, 3)]


def test_where_the_peak_is_inside_the_layers_the_first_k_win():
    # llama-small at 512 tokens, batch 4: the peak is a layer's backward; checkpointing the bottom layers
    # keeps only their inputs through every moment above them, and recomputes each when the least is alive
    spec = preset("llama-small", attn="sdpa")
    peak = {c: estimate(spec, 4, 512, layers=c).peak_bytes for c in candidates(4, 3)}
    assert min(peak, key=peak.get) == (0, 1, 2) and peak[(0, 1, 2)] < peak[(1, 2, 3)]
    assert layer_set_strategies(4, lambda c: estimate(spec, 4, 512, layers=c).peak_bytes) == [(0, 1, 2)]


def test_where_the_head_is_the_peak_every_set_is_alike_and_the_first_k_stay():
    spec = preset("llama-8b", dtype="bf16", attn="sdpa")
    peaks = {c: estimate(spec, 1, 8192, device="cuda", layers=c).peak_bytes for c in candidates(32, 9)}
    assert len(set(peaks.values())) == 1
    assert best_set(32, 9, peaks.get) == tuple(range(9))


def test_plan_adds_the_sets_beside_every_n_and_leaves_the_rest_as_it_was():
    spec = preset("llama-small", attn="sdpa")
    a = planner.Assumptions(memory_bytes=int(0.1 * 2**30), device="cpu", peak_flops_per_s=40e9)
    plain = planner.plan(spec, 512, a)
    both = planner.plan(spec, 512, a, layer_sets=True)
    assert [o for o in both if not o.layers] == plain
    sets = {o.strategy: o for o in both if o.layers}
    assert list(sets) == ["layers-0,1,2", "layers-0,1,2+offload"]
    by = {o.strategy: o for o in both}
    # three checkpointed layers: a batch between every-2's two layers and full's four
    assert by["every-2"].max_batch < sets["layers-0,1,2"].max_batch < by["full"].max_batch
    assert sets["layers-0,1,2"].layers == (0, 1, 2) and sets["layers-0,1,2"].every_n_layers == 0


def test_merged_rows_of_layer_sets_are_named_by_their_counts():
    rows = [planner.Option(f"layers-0…{k - 1}", 0, False, 1, 100, 10, 1.0, 5.0, layers=tuple(range(k)))
            for k in (9, 10)]
    assert [r.strategy for r in planner.merged(rows)] == ["layer sets of 9…10 (2 settings)"]


def test_layer_sets_are_refused_with_verify(capsys):
    from ckptbench.cli import main as cli_main

    assert cli_main(["plan", "--model", "llama-small", "--device", "cpu", "--memory", "0.1GiB", "--seq", "512",
                     "--layer-sets", "--verify"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --layer-sets:") and len(err.splitlines()) == 1
