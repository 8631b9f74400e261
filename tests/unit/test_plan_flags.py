"""`ckptbench plan` refuses every bad flag in one line, exit 2, before it plans anything."""

from __future__ import annotations

import pytest

from ckptbench.cli import main

BASE = ["plan", "--model", "llama-8b", "--device", "h100", "--seq", "8192", "--dtype", "bf16", "--attn", "sdpa"]


@pytest.mark.parametrize("flags,reason", [
    (["--world", "-2"], "argument --world: must be >= 1, got '-2'"),
    (["--local-sgd-steps", "-1"], "argument --local-sgd-steps: must be >= 0, got '-1'"),
])
def test_negative_counts_are_argument_errors(flags, reason, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*BASE, *flags])
    assert exit_.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(reason)


@pytest.mark.parametrize("flags,reason", [
    (["--memory", "0GiB"], "error: --memory: must be a finite size of at least one byte, got '0GiB'"),
    (["--memory", "1e999GiB"], "error: --memory: must be a finite size of at least one byte, got '1e999GiB'"),
    (["--calibration", "{tmp}/missing.json"], "error: --calibration {tmp}/missing.json: cannot read: No such file or directory"),
    (["--calibration", "{tmp}/notes.txt"], "error: --calibration {tmp}/notes.txt: not JSON: Expecting value: line 1 column 1 (char 0)"),
    (["--calibration", "{tmp}/list.json"], "error: --calibration {tmp}/list.json: not a calibration (a JSON object), got list"),
    (["--calibration", "{tmp}/nan.json"], "error: --calibration {tmp}/nan.json: h2d_bytes_per_s: must be a positive number, got nan"),
    (["--html", "{tmp}/no/such/dir/plan.html"], "error: --html {tmp}/no/such/dir/plan.html: no directory {tmp}/no/such/dir"),
    (["--html", "{tmp}"], "error: --html {tmp}: is a directory"),
    (["--model", 'org/name"\n[sweep]'], "is not a valid repository name"),
    (["--model", "org/bad name"], "is not a valid repository name"),
])
def test_bad_values_are_one_line_exit_2(flags, reason, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("measured: fast\n")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "nan.json").write_text('{"h2d_bytes_per_s": NaN}')
    argv = [*BASE, *(f.replace("{tmp}", str(tmp_path)) for f in flags)]
    if flags[0] == "--model":
        argv[2] = flags[1]
        argv = argv[:-2]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and reason.replace("{tmp}", str(tmp_path)) in err, err


def test_every_planned_card_is_what_torch_sees_and_has_a_datasheet_rate():
    from ckptbench.theory.policy import plan as planner

    gib = 2**30
    # the marketed size is not the allocator's: an "80 GB" H100 is about 79.2 GiB, an H200 about 139.8 GiB
    assert round(planner.DEVICE_MEMORY["h100"] / gib, 1) == 79.2
    assert round(planner.DEVICE_MEMORY["h200"] / gib, 1) == 139.8
    assert planner.DEVICE_MEMORY["h200"] != 141 * 10**9
    for card, (name, memory) in planner.CARDS.items():
        marketed = {"a100-40": 40, "a100": 80, "h100": 80, "h200": 141, "l40s": 48, "rtx4090": 24}[card]
        # memory chips come in GiB; the driver keeps some of it back
        assert 0.9 * marketed * 10**9 < memory < marketed * gib, card
        assert planner.datasheet_peak(name, "bf16"), card


def test_equivalent_strategies_are_one_row_and_every_family_stays_in_view():
    from ckptbench.point.case import preset
    from ckptbench.theory.policy.plan import Assumptions, merged, plan, shown_rows

    options = plan(preset("llama-8b", dtype="bf16", attn="sdpa"), 8192,
                   Assumptions(memory_bytes=150 * 2**30, device="cuda", device_name="H200", peak_flops_per_s=989e12))
    rows = merged(options)
    assert len(rows) < len(options)
    # every-16 ... every-31 of 32 layers each checkpoint layers 0 and 16..31's first: one answer, one row
    sixteen = next(r for r in rows if r.strategy.startswith("every-16…31 ") and not r.offload)
    assert sixteen.strategy == "every-16…31 (16 settings)"
    same = [o for o in options if 16 <= o.every_n_layers <= 31 and not o.offload]
    assert {(o.max_batch, o.peak_bytes, o.tokens_per_s) for o in same} == {
        (sixteen.max_batch, sixteen.peak_bytes, sixteen.tokens_per_s)}
    # no two rows of one family say the same thing
    keys = [(r.offload, r.every_n_layers in (0, 1), r.max_batch, r.max_seq, r.peak_bytes, r.tokens_per_s) for r in rows]
    assert len(keys) == len(set(keys))
    shown = shown_rows(options, 3)
    assert {"none", "full", "full+offload"} <= {r.strategy for r in shown}


def test_the_plan_page_titles_the_card_precision_and_memory_and_draws_from_zero():
    from ckptbench.point.case import preset
    from ckptbench.report.plan_section import plan_page
    from ckptbench.theory.policy.plan import Assumptions, plan, to_dict

    a = Assumptions(memory_bytes=81089 * 2**20, device="cuda", device_name="NVIDIA H100 80GB HBM3",
                    peak_flops_per_s=989e12)
    options = plan(preset("llama-1b", dtype="bf16", attn="sdpa"), 4096, a)
    page = plan_page(to_dict(options, a, 4096, "llama-1b (llama, 16 layers, bf16 sdpa)"))
    title = page[page.index("<h1>"):page.index("</h1>")]
    assert "bf16" in title and "79.19 GiB on NVIDIA H100 80GB HBM3" in title and "seq 4096" in title
    assert page.count("<tr") - 1 == len(to_dict(options, a)["rows"]) < len(options)


def test_a_runner_up_as_fast_says_what_tells_it_apart():
    """No recompute, no offload, the same batch: the runner-up differs in memory, and the line says so; one
    that fits a larger batch yet is slower says that."""
    from ckptbench.theory.policy.plan import Option, recommendation

    gib = 2**30
    best = Option("none", 0, False, 4, None, peak_bytes=70 * gib, step_s=1.0, tokens_per_s=1000.0)
    twin = Option("every-16", 16, False, 4, None, peak_bytes=66 * gib, step_s=1.0, tokens_per_s=1000.0)
    line = recommendation([best, twin])
    assert line.endswith("runner-up every-16 at batch 4, 1.00× as fast (it peaks at 66.00 GiB at batch 4, "
                         "none at 70.00 GiB)")
    bigger = Option("every-16", 16, False, 6, None, peak_bytes=75 * gib, step_s=1.6, tokens_per_s=960.0)
    assert recommendation([best, bigger]).endswith("0.96× as fast (batch 6 fits, but its predicted step is slower "
                                                   "per token)")
    recomputes = Option("every-2", 2, False, 6, None, peak_bytes=60 * gib, step_s=1.8, tokens_per_s=900.0,
                        recompute_flops_share=0.1)
    assert recommendation([best, recomputes]).endswith("(it recomputes 10% of its FLOPs)")


def test_on_a_cpu_offload_is_never_the_runner_up_s_cost():
    """On a CPU the host is the device: offload copies nothing, so "its offload copies cost time" would be
    false; the line says it is the same step.  On CUDA the copies are the reason."""
    from ckptbench.theory.policy.plan import Option, recommendation

    gib = 2**30
    best = Option("every-2", 2, False, 5, None, peak_bytes=gib // 12, step_s=0.169, tokens_per_s=3781.0,
                  recompute_flops_share=0.1)
    twin = Option("every-2+offload", 2, True, 5, None, peak_bytes=gib // 12, step_s=0.170, tokens_per_s=3773.0,
                  recompute_flops_share=0.1)
    on_cpu = recommendation([best, twin], "cpu")
    assert "offload copies cost time" not in on_cpu
    assert on_cpu.endswith("(on a CPU offload copies nothing: every-2's step and memory)")
    assert recommendation([best, twin], "cuda").endswith("(its offload copies cost time)")
    assert recommendation([best, twin]).endswith("(its offload copies cost time)")
