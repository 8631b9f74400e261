"""The FSDP2 formulas against counts worked out by hand (tests/e2e/test_fsdp.py holds them to a real run)."""

from dataclasses import replace

import pytest

from ckptbench.point.case import PRESETS, Case, analytic_sharded_point, preset
from ckptbench.point.setup import Setup
from ckptbench.point.training import TrainSpec
from ckptbench.theory.comm.fsdp import (
    fsdp_case_comm,
    fsdp_comm_estimate,
    fsdp_memory_estimate,
    local_elements,
    rank_state_bytes,
    shard_elements,
    unit_shapes,
    unit_shard_bytes,
)
from ckptbench.theory.memory.params import param_count
from ckptbench.train.support import refusal


def test_shards_pad_dim0_to_a_multiple_of_the_world():
    assert shard_elements((64, 64), 2) == 32 * 64
    assert shard_elements((64, 64), 3) == 22 * 64  # ceil(64 / 3) = 22 rows on every rank
    assert shard_elements((32, 64), 3) == 11 * 64
    assert shard_elements((64,), 3) == 22
    assert shard_elements((2, 5), 4) == 5  # fewer rows than ranks: one padded row each


def test_llama_tiny_world_2_by_hand():
    # a layer: q 64x64, k 32x64, v 32x64, o 64x64, gate/up 128x64, down 64x128, two norms of 64
    layer = 4096 + 2048 + 2048 + 4096 + 8192 + 8192 + 8192 + 64 + 64  # 36,992 elements
    root = 256 * 64 + 64 + 256 * 64  # embedding, final norm, untied LM head: 32,832 elements
    est = fsdp_comm_estimate(preset("llama-tiny"), 2, iterations=1)
    assert est["layer_shard_bytes"] == layer // 2 * 4 == 73_984
    assert est["root_shard_bytes"] == root // 2 * 4 == 65_664
    assert est["allgather_payload_bytes"] == 2 * 4 * 73_984 + 65_664 == 657_536
    assert est["allgather_count"] == 9
    assert est["reduce_scatter_payload_bytes"] == 2 * (4 * 73_984 + 65_664) == 723_200
    assert est["reduce_scatter_count"] == 5
    assert est["allgather_bus_bytes"] == 657_536  # (n - 1) x the per-rank input
    assert est["reduce_scatter_bus_bytes"] == 723_200 / 2


def test_llama_tiny_world_3_pads():
    # ceil(64/3)=22, ceil(32/3)=11, ceil(128/3)=43 rows
    layer = 22 * 64 + 11 * 64 + 11 * 64 + 22 * 64 + 43 * 64 + 43 * 64 + 22 * 128 + 22 + 22  # 12,588
    root = 86 * 64 + 22 + 86 * 64  # 11,030
    shard = unit_shard_bytes(preset("llama-tiny"), 3)
    assert shard == {"layer": layer * 4, "root": root * 4} == {"layer": 50_352, "root": 44_120}
    est = fsdp_comm_estimate(preset("llama-tiny"), 3, iterations=2)
    assert est["allgather_payload_bytes"] == 2 * (8 * 50_352 + 44_120)
    # the reduce-scatter input is the padded full gradient: 3 shards a unit, more than the unpadded model
    assert est["reduce_scatter_payload_bytes"] == 2 * 3 * (4 * 50_352 + 44_120) == 1_473_168
    assert est["reduce_scatter_payload_bytes"] > 2 * 4 * param_count(preset("llama-tiny")).total


@pytest.mark.parametrize("name", [n for n in PRESETS if preset(n).analytic])
def test_units_hold_every_parameter(name):
    spec = preset(name)
    shapes = unit_shapes(spec)
    total = spec.layers * sum(shard_elements(s, 1) for s in shapes["layer"]) + \
        sum(shard_elements(s, 1) for s in shapes["root"])
    counts = param_count(spec)
    assert total == counts.total
    assert spec.layers * len(shapes["layer"]) + len(shapes["root"]) == counts.n_tensors


def test_case_counts_every_micro_batch_and_the_memory_parts():
    train = TrainSpec(warmup_steps=1, memory_steps=1, steps=2)
    case = Case(model=preset("llama-tiny"), train=train, batch_size=2, seq_len=32, grad_accum=2, world_size=2,
                setup=Setup(sharding="fsdp"))
    assert fsdp_case_comm(case)["allgather_count"] == 9 * 4 * 2
    mem = fsdp_memory_estimate(case)
    assert mem["params_bytes"] == 4 * 73_984 + 65_664 + 64  # shards + the two rotary buffers (not sharded)
    assert mem["optimizer_bytes"] == 2 * (4 * 73_984 + 65_664) + 4 * 39  # two moments + a step per tensor
    # the second micro-batch's loss backward is the peak: the root gathered, the last layer only as its
    # flat all-gather output (not yet copied out into parameters)
    assert mem["peak_phase"] == "backward-head"
    assert mem["peak_params_bytes"] == mem["params_bytes"] + 2 * 65_664
    assert mem["peak_bytes"] == max(mem["phases"].values())


def test_adamw_state_is_the_unpadded_chunk_per_rank():
    # torch.chunk rows at world 3: 64 -> 22, 22, 20; 32 -> 11, 11, 10; 128 -> 43, 43, 42; 256 -> 86, 86, 84
    assert [local_elements((64, 64), 3, r) for r in range(3)] == [22 * 64, 22 * 64, 20 * 64]
    assert [local_elements((2, 5), 4, r) for r in range(4)] == [5, 5, 0, 0]  # late ranks hold nothing
    spec = preset("llama-tiny")
    assert rank_state_bytes(spec, 3, 0) == rank_state_bytes(spec, 3, 1) == unit_shard_bytes(spec, 3)["layer"] * 4 + \
        unit_shard_bytes(spec, 3)["root"]
    # rank 2: per layer 2·64 (q) + 64 (k) + 64 (v) + 2·64 (o) + 64 (gate) + 64 (up) + 2·128 (down) + 2 + 2
    # (norms) = 772 elements fewer, root 2·64 + 2 + 2·64 = 258 fewer
    assert rank_state_bytes(spec, 3, 0) - rank_state_bytes(spec, 3, 2) == (4 * 772 + 258) * 4
    case = Case(model=spec, train=TrainSpec(), batch_size=2, seq_len=32, world_size=3, setup=Setup(sharding="fsdp"))
    mems = [fsdp_memory_estimate(case, r) for r in range(3)]
    assert mems[0]["optimizer_bytes"] - mems[2]["optimizer_bytes"] == 2 * (4 * 772 + 258) * 4 == 26_768
    assert mems[0]["peak_bytes"] - mems[2]["peak_bytes"] == 26_768
    assert mems[0]["params_bytes"] == mems[2]["params_bytes"]  # padded shards: the same storage everywhere


def test_estimate_prints_each_fsdp_rank_and_the_collectives(capsys):
    from ckptbench.cli import main
    from ckptbench.point.case import Case, preset
    from ckptbench.point.setup import Setup
    from ckptbench.point.training import TrainSpec
    from ckptbench.theory.comm.fsdp import fsdp_comm_estimate, fsdp_memory_estimate

    assert main(["estimate", "--model", "llama-tiny", "--batch", "2", "--seq", "32", "--device", "cpu",
                 "--precision", "fp32", "--world", "3", "--sharding", "fsdp"]) == 0
    out = capsys.readouterr().out.splitlines()
    case = Case(model=preset("llama-tiny", attn="sdpa"), train=TrainSpec(), batch_size=2, seq_len=32, world_size=3,
                setup=Setup(sharding="fsdp"))
    rows = [line.split() for line in out if line.split() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [0, 1, 2]
    for rank, row in enumerate(rows):  # GiB to three places, and the phase
        m = fsdp_memory_estimate(case, rank)
        assert row[3] == f"{m['peak_bytes'] / 2**30:.3f}" and row[4] == m["peak_phase"]
    comm = fsdp_comm_estimate(case.model, 3, 1)
    assert f"{comm['allgather_payload_bytes']:,} B" in out[-1] and f"{comm['reduce_scatter_payload_bytes']:,} B" in out[-1]


def mixed(every_n: int = 2, device: str = "cpu", autocast: str = "bf16") -> Case:
    return Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=2, seq_len=32, every_n_layers=every_n,
                world_size=2, device=device, setup=Setup(sharding="fsdp", autocast=autocast))


def test_bf16_mixed_gathers_bf16_shards_and_reduces_fp32_by_hand():
    # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): each rank gathers a bf16 copy of its shard
    # (18,496 layer and 16,416 root elements x 2 B) and reduce-scatters fp32 gradients (N x the fp32 shard)
    est = fsdp_comm_estimate(preset("llama-tiny"), 2, iterations=1, autocast="bf16")
    assert est["allgather_payload_bytes"] == 2 * 4 * 36_992 + 32_832 == 657_536 // 2
    assert est["reduce_scatter_payload_bytes"] == 2 * (4 * 73_984 + 65_664) == 723_200
    assert (est["allgather_count"], est["reduce_scatter_count"]) == (9, 5)
    assert fsdp_case_comm(mixed())["allgather_payload_bytes"] == 5 * 328_768  # warm-up, memory, 3 timed steps


def test_bf16_mixed_keeps_fp32_shards_and_state_and_gathers_bf16():
    pure, mix = fsdp_memory_estimate(replace(mixed(), setup=Setup(sharding="fsdp"))), fsdp_memory_estimate(mixed())
    assert mix["params_bytes"] == pure["params_bytes"] == 4 * 73_984 + 65_664 + 64  # fp32 shards + buffers
    assert mix["optimizer_bytes"] == pure["optimizer_bytes"]
    # the unsharded root and layer in bf16: 32,832 and 36,992 elements x 2 B
    assert (mix["unsharded_root_bytes"], mix["unsharded_layer_bytes"]) == (65_664, 73_984)
    assert (pure["unsharded_root_bytes"], pure["unsharded_layer_bytes"]) == (131_328, 147_968)
    assert mix["peak_phase"].startswith("backward-layer-")
    assert mix["peak_params_bytes"] == mix["params_bytes"] + 65_664 + 73_984
    assert mix["peak_bytes"] < pure["peak_bytes"]


def test_sharded_points_the_estimate_describes():
    llama = preset("llama-tiny")
    # bf16-mixed under FSDP2 computes as a pure-bf16 model does, without autocast: described on any device
    assert analytic_sharded_point(llama, Setup(sharding="fsdp", autocast="bf16"), "cuda")
    assert analytic_sharded_point(llama, Setup(sharding="fsdp"), "cpu")
    assert not analytic_sharded_point(llama, Setup(sharding="fsdp", autocast="fp16"), "cuda")
    assert not analytic_sharded_point(replace(llama, dtype="bf16"), Setup(sharding="fsdp", autocast="bf16"))
    assert not analytic_sharded_point(llama, Setup(sharding="fsdp", autocast="bf16", loop="trainer"))


def test_fsdp_runs_bf16_mixed_and_refuses_fp16_mixed():
    assert refusal(mixed()) is None
    assert "sharded gradient scaler" in refusal(mixed(device="cuda", autocast="fp16"))


def test_an_fsdp_point_of_another_optimizer_has_its_collectives_checked_and_its_memory_left_unchecked():
    from ckptbench.theory.verdicts.checks import comm_checks

    sgd = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=2, seq_len=32, world_size=2,
               setup=Setup(sharding="fsdp", optimizer="sgd"))
    assert not analytic_sharded_point(sgd.model, sgd.setup, sgd.device)  # the composition counts AdamW's state
    comm = fsdp_case_comm(sgd)
    m = {"allgather_payload_bytes": comm["allgather_payload_bytes"], "allgather_count": comm["allgather_count"],
         "reduce_scatter_payload_bytes": comm["reduce_scatter_payload_bytes"],
         "reduce_scatter_count": comm["reduce_scatter_count"], "peak_bytes": 2_000_000}
    _, checks = comm_checks(sgd, m)
    verdicts = {c.quantity: c.verdict for c in checks}
    assert verdicts == {"allgather_payload_bytes": "pass", "allgather_count": "pass",
                        "reduce_scatter_payload_bytes": "pass", "reduce_scatter_count": "pass", "peak_bytes": "skip"}
