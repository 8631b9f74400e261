"""The second memory meter: torch's allocator events agree with the live-storage tracker within the bytes
the tracker cannot see, and a tensor hidden from the tracker makes them disagree."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run.worker import _memory_step
from ckptbench.theory.verdicts.meters import RNG_STATE_BOUND, SCALARS_BOUND, agreement, meter_checks
from ckptbench.train.checkpointing import decoder_layers, enable_checkpointing, offload_without_pinning
from ckptbench.train.models import build_model, synthetic_batch
from ckptbench.train.step import train_step


def _step(case: Case, hide_bytes: int = 0) -> dict:
    with offload_without_pinning() if case.offload else nullcontext():  # this torch has no pinned allocator
        return _built_step(case, hide_bytes)


def _built_step(case: Case, hide_bytes: int) -> dict:
    torch.manual_seed(0)
    model = build_model(case.model, torch.device("cpu"))
    enable_checkpointing(model, case.every_n_layers, case.offload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = synthetic_batch(case.model.vocab, case.batch_size, case.seq_len, 0, torch.device("cpu"))
    train_step(model, optimizer, batch, 1)  # the optimizer state exists before the measured step
    hidden = []
    if hide_bytes:
        def allocate_unseen(module, args, output):
            with _disable_current_modes():  # below the tracker's dispatch mode, as a kernel's scratch is
                hidden.append(torch.empty(hide_bytes, dtype=torch.uint8))
        decoder_layers(model)[1].register_forward_hook(allocate_unseen)
    return _memory_step(case, model, optimizer, batch, decoder_layers(model))


def _case(every_n: int, offload: bool = False) -> Case:
    return Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=2, seq_len=64, every_n_layers=every_n,
                offload=offload)


def test_the_two_meters_agree_within_what_the_tracker_cannot_see():
    for every_n, offload in ((0, False), (2, False), (1, True)):
        case = _case(every_n, offload)
        m = _step(case)
        tracked = m["tracked_resident_peak_bytes"] - m["tracked_start_bytes"]
        diff = m["allocator_growth_bytes"] - tracked
        assert 0 <= diff <= len(case.checkpointed_layers) * RNG_STATE_BOUND + SCALARS_BOUND, (every_n, diff)
        assert m["allocator_events"] > 100
        assert agreement(meter_checks(case, m)) == "agree"


def test_the_allocator_meter_is_the_same_to_the_byte_on_a_second_identical_step():
    a, b = _step(_case(2)), _step(_case(2))
    assert a["allocator_growth_bytes"] == b["allocator_growth_bytes"]
    assert a["tracked_resident_peak_bytes"] == b["tracked_resident_peak_bytes"]


def test_a_tensor_hidden_from_the_tracker_makes_the_meters_disagree():
    case = _case(0)
    m = _step(case, hide_bytes=2**20)
    checks = meter_checks(case, m)
    assert agreement(checks) == "disagree"
    assert 2**20 <= checks[0].difference <= 2**20 + SCALARS_BOUND


def test_a_missing_meter_is_unchecked_never_agreement():
    case = _case(0)
    assert agreement(meter_checks(case, {"tracked_start_bytes": 0, "tracked_resident_peak_bytes": 10})) == "unchecked"
    cuda = Case(model=preset("llama-tiny", dtype="bf16"), train=TrainSpec(), batch_size=1, seq_len=8, device="cuda")
    assert agreement(meter_checks(cuda, {"cuda_reserved_at_stop_bytes": 2**30})) == "unchecked"
    # the driver counts the context on top of the allocator's blocks: less than the blocks is impossible
    assert agreement(meter_checks(cuda, {"cuda_reserved_at_stop_bytes": 2**30,
                                         "nvml_process_used_bytes": 2**30 + 500 * 2**20})) == "agree"
    assert agreement(meter_checks(cuda, {"cuda_reserved_at_stop_bytes": 2**30,
                                         "nvml_process_used_bytes": 2**29})) == "disagree"


@pytest.mark.parametrize("m,k,n", [(64, 64, 8), (64, 128, 64), (256, 64, 64), (64, 8, 64), (64, 4, 64), (128, 8, 128),
                                   (512, 512, 512)])
def test_a_cpu_bf16_matmul_scratch_is_within_the_meters_allowance_and_fp32_has_none(m, k, n):
    from ckptbench.measure.allocator import AllocatorMeter
    from ckptbench.theory.verdicts.meters import BF16_SCRATCH_FIXED, BF16_SCRATCH_PER_ELEMENT

    torch.set_num_threads(1)

    def scratch(dtype):
        a, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
        torch.nn.functional.linear(a, w)  # the kernel's first call may set itself up
        meter = AllocatorMeter()
        meter.start()
        out = torch.nn.functional.linear(a, w)
        meter.stop()
        return meter.growth - out.untyped_storage().nbytes()

    assert scratch(torch.float32) == 0
    # whether a bf16 matmul allocates scratch at all depends on the CPU's kernel (an AVX2-only AMD EPYC
    # allocates none, a CPU whose kernel converts to fp32 some): where it does, the allowance covers it
    assert 0 <= scratch(torch.bfloat16) <= BF16_SCRATCH_PER_ELEMENT * (m * k + k * n + m * n) + BF16_SCRATCH_FIXED


def test_the_bf16_scratch_allowance_applies_to_bf16_matmuls_on_cpu_only():
    from ckptbench.point.setup import Setup
    from ckptbench.theory.verdicts.meters import bf16_matmul_scratch_bound

    base = dict(model=preset("llama-tiny"), train=TrainSpec(), batch_size=2, seq_len=32)
    assert bf16_matmul_scratch_bound(Case(**base)) == 0
    mixed = Case(**base, setup=Setup(autocast="bf16"))
    # 64 tokens of hidden 64, the 64 x 256 LM head and its 64 x 256 output, 4 bytes each, plus the fixed part
    assert bf16_matmul_scratch_bound(mixed) == 4 * (64 * 64 + 64 * 256 + 64 * 256) + 5_120
    assert bf16_matmul_scratch_bound(Case(**{**base, "model": preset("llama-tiny", dtype="bf16")})) > 0
    # a tensor the tracker missed, larger than every blind spot, still makes the meters disagree
    m = {"tracked_start_bytes": 0, "tracked_resident_peak_bytes": 10**6,
         "allocator_growth_bytes": 10**6 + bf16_matmul_scratch_bound(mixed) + 1024 + 1}
    assert agreement(meter_checks(mixed, m)) == "disagree"


def test_a_block_from_an_earlier_profiled_step_freed_in_this_one_is_left_out_and_counted():
    """What made a trainer point's meters differ by 65,508 B under a test runner: a 64 KiB block allocated in
    an earlier profiled window of the same thread, still alive, freed inside this step.  The profiler reports
    that free (it knows the block's size); the tracker never held the block.  Blocks the step's accounting
    holds at its start still count when freed."""
    from ckptbench.measure.allocator import AllocatorMeter
    from ckptbench.measure.storage import LiveStorageTracker

    earlier = AllocatorMeter()
    earlier.start()
    stray, held = torch.empty(16_384), torch.empty(4_096)  # 65,536 B and 16,384 B, both from before the step
    earlier.stop()
    tracker = LiveStorageTracker()
    tracker.track(held, "params")
    meter = AllocatorMeter()
    meter.start(frozenset(tracker.held_addresses))
    del stray  # nobody listed it: left out of the sum
    del held  # the accounting held it: its free counts
    made = torch.empty(8_192)  # 32,768 B allocated by the step
    meter.stop()
    assert meter.unlisted_frees == 65_536
    assert meter.growth == 32_768 - 16_384  # with the stray free counted it would be 0 (-81,920 + 32,768)
    assert meter.result()["allocator_unlisted_frees_bytes"] == 65_536
    del made


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seq, head_dim", [(64, 128), (300, 64)])
def test_the_cpu_flash_attention_buffers_are_the_allocators_view_of_one_call(dtype, threads, seq, head_dim):
    """The kernel's buffers (below the dispatcher) as the allocator meter counts them, forward and backward:
    its growth beyond the output and the log-sum-exp (forward), the three gradients and one output-sized
    buffer (backward), to the byte."""
    if dtype == torch.bfloat16 and torch.backends.cpu.get_cpu_capability() != "AVX2":
        pytest.skip(f"the 16-bit kernel's buffers are modelled as torch's AVX2 kernel allocates them; this CPU "
                    f"runs its {torch.backends.cpu.get_cpu_capability()} kernel, whose backward keeps more")
    from ckptbench.measure.allocator import AllocatorMeter
    from ckptbench.theory.verdicts.meters import flash_attention_cpu_buffers

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, k, v = (torch.randn(2, 4, seq, head_dim, dtype=dtype) for _ in range(3))
        meter = AllocatorMeter()
        meter.start()
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        meter.stop()
        forward = meter.growth
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        grad = torch.ones_like(out)
        meter = AllocatorMeter()
        meter.start()
        out.backward(grad)
        meter.stop()
        backward = meter.growth
    finally:
        torch.set_num_threads(before)
    element = 2 if dtype == torch.bfloat16 else 0
    lse, size = 2 * 4 * seq * 4, out.numel() * out.element_size()
    buffers = flash_attention_cpu_buffers(seq, head_dim, threads, element)
    assert forward - size - lse == buffers[0]
    # the backward: q's, k's and v's gradients and one buffer the size of the output (a tensor the tracker
    # sees), then the kernel's own
    assert backward - 4 * size == buffers[1]
