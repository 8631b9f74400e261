"""Exposed communication: FSDP2's prefetch and DDP's buckets against hand-worked cases, and the plan's use."""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.theory.comm.network import LINKS, Link, allgather_s, allreduce_s, link_named, reduce_scatter_s
from ckptbench.theory.comm.overlap import LayerCompute, ddp_buckets, ddp_exposed, fsdp_exposed, split_by_flops
from ckptbench.theory.memory.params import param_count
from ckptbench.theory.policy.plan import Analytic, Assumptions, ShardedAnalytic
from ckptbench.theory.time.planspeed import comm_time, ring_link

MIB = 2**20


def test_fsdp_hides_every_gather_but_the_first_and_every_scatter_but_the_last_when_layers_are_slow():
    # 4 layers, forward 10 ms, backward 20 ms; all-gather 3 ms, reduce-scatter 5 ms, root 1 ms and 2 ms:
    # exposed = root AG 1 + layer 0's AG 3 + layer 0's RS 5 + root RS 2 = 11 ms; the LM head's backward
    # (4 ms) hides the last layer's backward gather
    c = LayerCompute(4, 0.010, 0.020, 0.0, (), head_fwd=0.002, head_bwd=0.004)
    assert fsdp_exposed(c, 0.003, 0.005, 0.001, 0.002) == pytest.approx(0.011)


def test_fsdp_pays_what_each_layer_cannot_hide_and_recompute_hides_more():
    # 3 layers, forward 2 ms, backward 4 ms, no head; AG 5 ms, RS 3 ms, root nothing.
    # forward: AG 5 first, then layers 1 and 2's AG exceed a 2 ms forward by 3 each: 5 + 6
    # backward: the last layer's AG behind a 0 ms head: 5; layer 2 hides AG(1) 5 - 4 = 1; layer 1 AG(0) + RS(2)
    # 8 - 4 = 4; layer 0 RS(1) 3 - 4 < 0: 0; then RS(0) 3.  Total 5 + 6 + 5 + 1 + 4 + 0 + 3 = 24 ms
    plain = LayerCompute(3, 0.002, 0.004, 0.002, ())
    assert fsdp_exposed(plain, 0.005, 0.003, 0.0, 0.0) == pytest.approx(0.024)
    # layer 1 checkpointed: its backward is 4 + 2 ms, so it leaves 8 - 6 = 2 exposed, not 4
    ckpt = LayerCompute(3, 0.002, 0.004, 0.002, (1,))
    assert fsdp_exposed(ckpt, 0.005, 0.003, 0.0, 0.0) == pytest.approx(0.022)
    assert ckpt.backward == pytest.approx(3 * 0.004 + 0.002)


def test_ddp_buckets_fill_from_the_last_parameters_the_first_one_small():
    # parameters registered 8, 30, 10, 10, 2 MiB: the backward yields 2, 10, 10, 30, 8; the first bucket
    # closes at 1 MiB (2), the next at 25 MiB (10+10+30 = 50), the rest is the last (8)
    assert ddp_buckets([8 * MIB, 30 * MIB, 10 * MIB, 10 * MIB, 2 * MIB]) == [2 * MIB, 50 * MIB, 8 * MIB]
    assert sum(ddp_buckets([3, 5, 7], cap=4, first=1)) == 15


def test_ddp_waits_for_the_last_bucket_or_for_what_the_backward_cannot_cover():
    assert ddp_exposed(1.0, [0.1, 0.2, 0.05]) == pytest.approx(0.05)  # hidden but the last
    assert ddp_exposed(0.2, [0.1, 0.2, 0.05]) == pytest.approx(0.15)  # 0.35 on the link, 0.2 of backward
    assert ddp_exposed(0.2, []) == 0.0


def test_a_timer_without_phases_splits_a_step_by_its_flops():
    c = split_by_flops(1.4, 4, (0, 2))  # 3 x 4 + 2 thirds: a forward is 0.1 s
    assert (c.fwd, c.bwd, c.recompute) == pytest.approx((0.1, 0.2, 0.1))
    assert c.total == pytest.approx(1.4)


def test_collectives_on_a_ring_by_their_bus_bytes():
    link = Link("test", 1e9, 1e-5, "1 GB/s, 10 us", 0.5)  # 0.5 GB/s bus bandwidth
    assert allgather_s(1e6, 4, link) == pytest.approx(3e-5 + 3 * 1e6 / 0.5e9)
    assert reduce_scatter_s(4e6, 4, link) == pytest.approx(3e-5 + 0.75 * 4e6 / 0.5e9)
    assert allreduce_s(4e6, 4, link) == pytest.approx(6e-5 + 1.5 * 4e6 / 0.5e9)
    assert allgather_s(1e6, 1, link) == reduce_scatter_s(1e6, 1, link) == 0.0


def test_a_ring_across_hosts_is_as_fast_as_its_slowest_link():
    base = dict(memory_bytes=80 * 2**30, device="cuda", device_name="NVIDIA H100 80GB HBM3")
    assert ring_link(Assumptions(**base, world=8, network="NVLink")).name == "NVLink"
    ib = ring_link(Assumptions(**base, world=64, network="400G IB"))
    assert ib.bus_Bps == link_named("400G IB").bus_Bps == 45e9
    # a host of PCIe 4 GPUs is slower inside (24 GB/s bus) than its 400G NICs
    pcie = ring_link(Assumptions(**base, world=16, network="400G IB", intra="PCIe 4"))
    assert pcie.bus_Bps == pytest.approx(32e9 * 0.75) and pcie.latency_s == link_named("400G IB").latency_s
    assert all(k.bus_Bps <= k.bandwidth_Bps for k in LINKS)


def _case(spec, batch=1, n=1, ga=1):
    return Case(model=spec, train=TrainSpec(), batch_size=batch, seq_len=4096, every_n_layers=n, device="cuda",
                grad_accum=ga)


def test_the_plans_fsdp_comm_is_its_units_on_the_ring_and_hides_behind_slow_layers():
    spec = preset("llama-8b", dtype="fp32", attn="sdpa")
    a = Assumptions(80 * 2**30, "cuda", "NVIDIA H100 80GB HBM3", world=8, network="NVLink", sharding="fsdp")
    case = _case(spec)
    slow = LayerCompute(spec.layers, 1.0, 2.0, 1.0, tuple(range(spec.layers)), 1.0, 1.0)
    comm = comm_time(case, a, ShardedAnalytic(8), slow)
    from ckptbench.theory.comm.fsdp import unit_shard_bytes

    link = link_named("NVLink")
    shard = unit_shard_bytes(spec, 8)
    ag, rs = allgather_s(shard["layer"], 8, link), reduce_scatter_s(8 * shard["layer"], 8, link)
    ag_root, rs_root = allgather_s(shard["root"], 8, link), reduce_scatter_s(8 * shard["root"], 8, link)
    assert comm.total_s == pytest.approx(2 * spec.layers * ag + ag_root + spec.layers * rs + rs_root)
    assert comm.exposed_s == pytest.approx(ag_root + ag + rs + rs_root)  # seconds-long layers hide the rest
    # two micro-batches gather and scatter twice
    assert comm_time(_case(spec, ga=2), a, ShardedAnalytic(8), slow).total_s == pytest.approx(2 * comm.total_s)


def test_the_plans_ddp_comm_buckets_every_gradient_byte_once():
    spec = preset("llama-8b", dtype="bf16", attn="sdpa")
    a = Assumptions(80 * 2**30, "cuda", "NVIDIA H100 80GB HBM3", world=4, network="1 GbE")
    case = _case(spec)
    from ckptbench.theory.time.planspeed import _ddp_param_bytes

    grads = _ddp_param_bytes(case)
    # every bf16 weight's gradient once (the rotary buffer, 512 B, has none)
    assert sum(grads) == 2 * param_count(spec).total == Analytic().params_bytes(case) - param_count(spec).buffers_bytes
    assert len(grads) == param_count(spec).n_tensors
    link = link_named("1 GbE")
    idle = LayerCompute(spec.layers, 0.0, 0.0, 0.0, ())
    comm = comm_time(case, a, Analytic(), idle)
    assert comm.total_s == pytest.approx(sum(allreduce_s(b, 4, link) for b in ddp_buckets(grads)))
    assert comm.exposed_s == comm.total_s  # nothing to hide behind
    local = comm_time(case, Assumptions(**{**a.__dict__, "local_sgd_steps": 64}), Analytic(), idle)
    assert local.total_s == local.exposed_s == pytest.approx(allreduce_s(sum(grads), 4, link) / 64)
