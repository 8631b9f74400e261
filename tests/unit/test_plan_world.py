"""Planning data parallel: what each rank holds more (DDP's buckets), what the link costs, what all ranks do."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.theory.comm.network import LINKS, allreduce_s
from ckptbench.theory.memory.estimate import estimate_case
from ckptbench.theory.policy.plan import Analytic, Assumptions, comm_seconds, plan

SPEC = preset("llama-8b", dtype="bf16", attn="sdpa")
H200 = dict(memory_bytes=141 * 10**9, device="cuda", device_name="H200", peak_flops_per_s=989e12,
            reserved_margin=0.1, context_bytes=600 * 2**20)


def _case(batch: int, n: int = 1) -> Case:
    return Case(model=SPEC, train=TrainSpec(), batch_size=batch, seq_len=8192, every_n_layers=n, device="cuda")


def test_each_rank_holds_a_gradient_sized_bucket_more_and_tokens_are_those_of_all_ranks():
    one = {o.strategy: o for o in plan(SPEC, 8192, Assumptions(**H200))}
    eight = {o.strategy: o for o in plan(SPEC, 8192, Assumptions(**H200, world=8, network="NVLink"))}
    params = estimate_case(_case(1)).params_bytes
    full = eight["full"]
    assert full.peak_bytes == estimate_case(_case(full.max_batch)).peak_bytes + params
    assert all(eight[k].max_batch <= one[k].max_batch for k in one)
    assert full.tokens_per_s == 8 * full.max_batch * 8192 / full.step_s


def test_the_link_costs_ddps_bucketed_all_reduce_every_step_or_the_parameters_every_k():
    link = next(k for k in LINKS if k.name == "1 GbE")
    params = estimate_case(_case(1)).params_bytes
    ddp = comm_seconds(_case(1), Assumptions(**H200, world=4, network="1 GbE"), Analytic())
    # the buckets' all-reduces (one latency term each) less what the backward hides: minutes on 1 Gbit/s
    assert allreduce_s(params, 4, link) * 0.5 < ddp <= allreduce_s(params, 4, link) + 1 and ddp > 60
    local = comm_seconds(_case(1), Assumptions(**H200, world=4, network="1 GbE", local_sgd_steps=64), Analytic())
    assert local == allreduce_s(params, 4, link) / 64
    assert comm_seconds(_case(1), Assumptions(**H200), Analytic()) == 0.0  # one rank sends nothing


@pytest.mark.slow
def test_plan_writes_a_self_contained_page(tmp_path):
    page = tmp_path / "plan.html"
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "plan", "--model", "llama-8b", "--device", "h200",
                           "--seq", "8192", "--dtype", "bf16", "--attn", "sdpa", "--html", str(page)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    recommended = next(line for line in proc.stdout.splitlines() if line.startswith("recommended: "))
    assert recommended.removeprefix("recommended: ").split(":")[0] in html
    # 65 strategies and streamed offload beside each of the 32 offloading ones, those giving one answer merged:
    # 23 rows as before streamed offload, 11 of it, and the header
    assert html.count("<tr") == 1 + 23 + 11 and html.count("offload-streamed") >= 11 and "class=best" in html and "data:image/svg+xml;base64," in html
    assert "http" not in html.replace("http-equiv", "")  # nothing fetched from elsewhere


def test_plan_shards_bf16_mixed_with_fsdp2s_mixed_precision(capsys):
    import json
    from dataclasses import replace

    from ckptbench.cli import main
    from ckptbench.point.setup import Setup
    from ckptbench.theory.comm.fsdp import fsdp_memory_estimate

    # bf16-mixed is plan's default precision
    assert main(["plan", "--model", "llama-8b", "--device", "h100", "--seq", "8192", "--world", "8",
                 "--sharding", "fsdp", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "bf16-mixed" in out["model"] and out["assumptions"]["sharding"] == "fsdp"
    best = out["options"][0]
    case = Case(model=preset("llama-8b", attn="sdpa"), train=TrainSpec(), batch_size=best["max_batch"], seq_len=8192,
                every_n_layers=best["every_n_layers"], offload=best["offload"], device="cuda", world_size=8,
                setup=Setup(autocast="bf16", sharding="fsdp"))
    mixed = fsdp_memory_estimate(case)["peak_bytes"]
    assert best["peak_bytes"] == mixed
    # fp32 shards and AdamW state over bf16 compute: above pure bf16, below pure fp32
    pure = replace(case, setup=Setup(sharding="fsdp"))
    assert fsdp_memory_estimate(replace(pure, model=replace(case.model, dtype="bf16")))["peak_bytes"] < mixed < \
        fsdp_memory_estimate(pure)["peak_bytes"]


def _plan(*flags, timeout=300):
    return subprocess.run([sys.executable, "-m", "ckptbench", "plan", *flags], capture_output=True, text=True,
                          timeout=timeout)


def test_a_fixed_batch_ranks_every_strategy_there_with_compute_comm_and_exposed_in_json():
    import json

    proc = _plan("--model", "llama-8b", "--device", "h100", "--seq", "4096", "--precision", "bf16-mixed",
                 "--attn", "sdpa", "--world", "16", "--sharding", "fsdp", "--network", "400G IB", "--batch", "2",
                 "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    timed = [o for o in d["options"] if o["batch"]]
    assert timed and all(o["batch"] == 2 for o in timed)
    assert all(o["batch"] == 0 and o["step_s"] is None for o in d["options"] if o["max_batch"] < 2)
    assert d["recommendation"].split(":")[0].endswith("at batch 2")
    for o in timed:
        assert o["step_s"] == pytest.approx(o["compute_s"] + o["exposed_s"])
        assert 0 < o["exposed_s"] < o["comm_s"] and o["step_low_s"] < o["step_s"] < o["step_high_s"]
    assert "16 ranks" in d["assumptions"]["sources"]["network"] and "2 hosts of 8" in \
        d["assumptions"]["sources"]["network"]


@pytest.mark.parametrize("flags, says", [
    (("--world", "12", "--network", "400G IB"), "--world 12: not a multiple of --ranks-per-host 8"),
    (("--world", "16"), "--network NVLink: links GPUs inside one host, and --world 16 spans 2 hosts of 8"),
    (("--world", "16", "--network", "400G IB", "--intra-host", "PCIe 5", "--batch", "4096"),
     "--batch 4096: no strategy fits it at seq 4096"),
])
def test_a_cluster_that_cannot_be_is_one_line_naming_the_flag(flags, says):
    proc = _plan("--model", "llama-8b", "--device", "h100", "--seq", "4096", "--sharding", "fsdp", *flags)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and says in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_fsdp_ranks_sac_policies_at_a_fixed_batch_in_json():
    """One FSDP2 rank's peak under a SAC policy is the sharded plain checkpointing estimate plus what the
    policy keeps beyond it on one rank: between the plain checkpointing and nothing checkpointed."""
    import json

    proc = _plan("--model", "llama-tiny", "--device", "h100", "--seq", "512", "--precision", "bf16-mixed",
                 "--world", "2", "--sharding", "fsdp", "--sac", "save-matmuls", "--batch", "2", "--memory", "1GiB",
                 "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    by = {o["strategy"]: o for o in d["options"]}
    sac = by["sac-save-matmuls"]
    assert sac["batch"] == 2 and sac["sac"] == "save-matmuls" and sac["step_s"] > 0
    assert by["full"]["peak_bytes"] < sac["peak_bytes"] < by["none"]["peak_bytes"]
    assert sac["step_s"] < by["full"]["step_s"]  # it recomputes less than plain full checkpointing
    assert "its excess over plain checkpointing added to the sharded rank" in d["memory_source"]
