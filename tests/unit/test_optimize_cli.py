"""plan --optimize on the command line: its flags, and its optimum against every strategy plan ranks."""

from __future__ import annotations

import json

import pytest

from ckptbench.cli import main as cli_main
from ckptbench.cli.verify_optimum import compile_curve
from ckptbench.store.schema import EMPTY, Measurement


@pytest.mark.parametrize("extra,flag", [(["--host-memory", "1GiB"], "--host-memory"),
                                        (["--optimize", "--compile-budgets", "0.5"], "--compile-budgets"),
                                        (["--optimize", "--verify", "--compile-budgets", "2"], "--compile-budgets"),
                                        (["--optimize", "--pinned-memory", "lots"], "--pinned-memory"),
                                        (["--optimize", "--layer-sets"], "--layer-sets")])
def test_bad_flags_are_one_line_naming_the_flag(capsys, extra, flag):
    assert cli_main(["plan", "--model", "llama-small", "--device", "h100", "--seq", "512", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag}") and len(err.splitlines()) == 1


def test_the_optimum_is_at_least_every_strategy_it_could_have_chosen(capsys, tmp_path):
    # a card that is not here: its roofline prices each step, and no baseline is measured
    assert cli_main(["plan", "--optimize", "--model", "llama-small", "--device", "h100", "--memory", "1.2GiB",
                     "--seq", "2048", "--precision", "fp32", "--json", "--handover", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    best = out["optimum"]
    assert out["optimality_gap"] == 0.0 and best["checked"]["peak_agrees"] and best["checked"]["step_additive"]
    assert out["undetermined_sets"] == 0 and "optimality gap 0: every set reached" in out["proof"]
    # the relaxation (no recompute costs anything) bounds every policy: the optimum is at or below it
    assert out["bound_tokens_per_s"] >= best["tokens_per_s"] and out["gap_bound"] == pytest.approx(
        out["bound_tokens_per_s"] / best["tokens_per_s"] - 1)
    assert best["peak_bytes"] * 1.1 + 600 * 2**20 <= 1.2 * 2**30
    ranked = out["best_ranked"]
    assert best["tokens_per_s"] >= ranked["tokens_per_s"] * (1 - 1e-12) or ranked["offload_kind"] == "streamed"
    every_n = out["best_every_n"]  # the best of what every_n_layers can say: never ahead of the optimum
    assert not every_n["layers"] and not every_n["sac"] and every_n["tokens_per_s"] <= ranked["tokens_per_s"]
    assert out["gap_every_n"] == best["tokens_per_s"] / every_n["tokens_per_s"] - 1 >= out["gap"]
    assert sorted(p.name for p in tmp_path.iterdir()) >= ["optimum.json", "optimum.toml", "policy.py"]


def test_the_compile_curve_is_reported_as_measured_not_assumed_monotonic():
    rec = [(0.0, "ok", Measurement(peak_bytes=3 * 2**20, tokens_per_s=900.0)),
           (0.5, "ok", Measurement(peak_bytes=2 * 2**20, tokens_per_s=1000.0)), (1.0, "oom", EMPTY)]
    line = compile_curve(rec, 2**30, None)
    assert "0→0.5: not monotonic" in line and "1: 0.0000 GiB, oom" in line
    line = compile_curve(rec[:1], 2**20, (1200.0, 1100.0, 1300.0))
    assert "(over the budget)" in line and "did not fall" in line and "1,200 tokens/s" in line


def test_verify_measures_the_best_every_n_strategy_only_when_it_is_not_the_ranked_one():
    from ckptbench.cli.verify_optimum import compared, verdict
    from ckptbench.theory.policy.plan import Option

    def option(strategy, n, batch, layers=()):
        return Option(strategy=strategy, every_n_layers=n, offload=False, max_batch=batch, max_seq=None,
                      layers=layers)

    ranked, every_2 = option("layers-0,1", 0, 6, (0, 1)), option("every-2", 2, 5)
    assert [t for t, _ in compared(ranked, every_2)] == ["ranked", "every-n"]
    assert [t for t, _ in compared(every_2, option("every-2", 2, 5))] == ["ranked"]
    assert [t for t, _ in compared(None, every_2)] == ["every-n"] and compared(None, None) == []
    # tied while the intervals overlap, else the side the whole interval lies on
    assert verdict((100.0, 95.0, 105.0), (98.0, 93.0, 96.0)) == "tied within the intervals with"
    assert verdict((110.0, 107.0, 112.0), (100.0, 95.0, 106.0)) == "faster than"
    assert verdict((90.0, 85.0, 94.0), (100.0, 95.0, 106.0)) == "slower than"


def test_a_gap_is_unknown_when_sets_went_unanswered_and_bounded_by_the_relaxation():
    from ckptbench.theory.policy.optimize import Result, Solution

    best = Solution(batch=2, mode="", layers=(0,), step_s=1.0, tokens_per_s=800.0, peak_bytes=1)
    result = Result(best, [best], undetermined=3, bound_tokens_per_s=1000.0)
    assert result.optimality_gap is None and result.gap_bound == pytest.approx(0.25)
    assert Result(best, [best], undetermined=0, bound_tokens_per_s=1000.0).optimality_gap == 0.0
    assert Result(None, []).optimality_gap is None and Result(None, []).gap_bound is None
