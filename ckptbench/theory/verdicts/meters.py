"""Two meters of one step's memory, and whether they agree as far as they are expected to.

Not an estimate against a measurement: two observations of the same quantity by code that shares
nothing, set beside each other with the difference each one's blind spots explain, and no more.

CPU — the live-storage tracker (dispatcher level) against torch's allocator events (profiler,
``measure/allocator``), both as growth over the step's start.  The allocator also sees what is
allocated below the dispatcher: the CPU RNG state non-reentrant checkpoint saves for each checkpointed
layer (``torch.get_rng_state()``: 5,056 bytes, at most one per checkpointed layer alive at once) and a
few scalars (32-128 bytes measured).  So ``0 ≤ allocator − tracker ≤ checkpointed layers × 5,120 + 1 KiB``;
anything else is a tensor one of them missed.  Where the matmuls run in bf16 (pure bf16 or bf16-mixed), the
CPU kernel also allocates scratch below the dispatcher for the call it runs: measured alone, (m, k, n) =
(64, 64, 8): 7,168 B; (64, 8, 64): 9,216; (64, 64, 64): 13,312; (64, 128, 64): 21,504; (512, 512, 512):
529,408; (2048, 896, 4864): 128,128; (64, 4096, 4096): 289,920; fp32 matmuls none.  A CPU with bf16
instructions (``avx512_bf16``) pads a narrow inner dimension: (64, 8, 64): 21,504; (64, 4, 64) and
(64, 16, 64): 21,504 too; (128, 8, 128): 37,888.  Every one is within ``4·(m·k + k·n + m·n) + 5,120`` B
(each operand and the output in fp32, as such a kernel may widen them), so one call's scratch of the
step's widest shapes is allowed on top.

``sdpa`` on a CPU runs torch's flash-attention kernel, whose per-thread buffers are allocated below the
dispatcher too (fp32 accumulators; q and kv are cut into blocks of ``qs = min(32 | 64 | 256, S)`` rows
(S < 192 | < 768 | longer) and ``kvs = min(512, S)``): the forward's ``T·(qs·kvs + 2·qs + qs·D)·4`` B,
``T·qs·kvs·e`` more for 16-bit inputs (e bytes an element); the backward's ``T·2·qs·kvs·4 + qs·4`` B,
``T·2·qs·kvs·e`` more for 16-bit inputs, with T the threads and D the head dimension.  Measured alone
(fp32 and bf16; 1 and 2 threads; S 64, 300, 1024; D 64, 128) the forward's is the formula to the byte,
the backward's the formula beside one buffer the size of the output, which the tracker sees.  One call's
(the larger of the two) is allowed on top: a run_clm-shaped llama with head_dim 128 (a width its hidden
size of 64 does not give) has its peak inside the attention's backward: 16,512 B beyond the tracker at
one thread, 32,896 B at two (``tests/e2e/test_track.py``).

CUDA — the allocator's reserved blocks at the end of the step against the driver's count of this
process (NVML), which adds the CUDA context and library workspaces (cuBLAS, cuDNN): ``0 ≤ NVML −
reserved ≤ 3 GiB``.  The difference is stated as ``cuda_context_bytes``.
"""

from __future__ import annotations

from ...point.case import Case
from .checks import Check

RNG_STATE_BOUND = 5_120  # per checkpointed layer: torch.get_rng_state() is 5,056 bytes on CPU
SCALARS_BOUND = 1_024
BF16_SCRATCH_FIXED = 5_120
BF16_SCRATCH_PER_ELEMENT = 4  # bytes per element of the operands and the output (fp32: see the module's text)
CUDA_CONTEXT_BOUND = 3 * 2**30


def _within(quantity: str, measured: int | None, reference: int | None, allowance: int) -> Check:
    """`measured` may exceed `reference` by 0..`allowance` bytes; a missing meter is ``skip``."""
    if measured is None or reference is None:
        return Check(quantity, measured, reference, None, None, "skip", None)
    diff = measured - reference
    ok = 0 <= diff <= allowance
    return Check(quantity, measured, reference, measured / reference if reference else None,
                 allowance / reference if reference else None, "pass" if ok else "fail", diff)


def bf16_matmul_scratch_bound(case: Case) -> int:
    """One CPU bf16 matmul call's scratch, bounded for the step's widest shapes (see the module's text):
    ``4·(m·k + k·n + m·n) + 5,120`` with m the tokens and k, n the widest matrix the model multiplies by
    (its hidden size by its widest dimension: the MLP or the LM head); the sum is the same in whichever
    orientation the backward multiplies."""
    if case.device != "cpu" or case.compute_dtype != "bf16":
        return 0
    spec = case.model
    tokens = case.batch_size * case.seq_len
    widest = max(spec.intermediate, spec.vocab, spec.hidden)
    return BF16_SCRATCH_PER_ELEMENT * (tokens * spec.hidden + spec.hidden * widest + tokens * widest) + BF16_SCRATCH_FIXED


def flash_attention_cpu_buffers(seq: int, head_dim: int, threads: int, element: int = 0) -> tuple[int, int]:
    """(forward, backward) bytes of torch's CPU flash-attention kernel's own buffers for one call (see the
    module's text); `element` is the bytes of an input element when the inputs are 16-bit, else 0."""
    qs = min(256 if seq >= 768 else 64 if seq >= 192 else 32, seq)
    kvs = min(512, seq)
    forward = threads * ((qs * kvs + 2 * qs + qs * head_dim) * 4 + qs * kvs * element)
    backward = threads * (2 * qs * kvs * 4 + 2 * qs * kvs * element) + qs * 4
    return forward, backward


def sdpa_cpu_scratch_bound(case: Case, threads: int) -> int:
    """One CPU flash-attention call's buffers below the dispatcher: the larger of its forward's and its
    backward's, for `threads` threads; 0 for another attention or device."""
    if case.device != "cpu" or case.model.attn != "sdpa":
        return 0
    head_dim = int(case.model.config_extra.get("head_dim") or case.model.head_dim)  # a config's own width
    element = 2 if case.compute_dtype in ("bf16", "fp16") else 0
    return max(flash_attention_cpu_buffers(case.seq_len, head_dim, max(1, int(threads)), element))


def meter_checks(case: Case, m: dict) -> list[Check]:
    if case.device == "cuda":
        return [_within("nvml_process_vs_reserved_bytes", m.get("nvml_process_used_bytes"),
                        m.get("cuda_reserved_at_stop_bytes"), CUDA_CONTEXT_BOUND)]
    start, peak = m.get("tracked_start_bytes"), m.get("tracked_resident_peak_bytes")
    tracked = None if start is None or peak is None else peak - start
    allowance = (len(case.checkpointed_layers) * RNG_STATE_BOUND + SCALARS_BOUND + bf16_matmul_scratch_bound(case)
                 + sdpa_cpu_scratch_bound(case, m.get("threads") or case.train.threads))
    return [_within("allocator_vs_tracker_bytes", m.get("allocator_growth_bytes"), tracked, allowance)]


def agreement(checks: list[Check]) -> str:
    """``agree`` / ``disagree`` / ``unchecked`` (a meter missing: never agreement by default)."""
    verdicts = {c.verdict for c in checks}
    if "fail" in verdicts:
        return "disagree"
    return "agree" if verdicts == {"pass"} else "unchecked"


def context_bytes(m: dict) -> int | None:
    """On CUDA, what the driver counts for the process beyond the allocator: context and workspaces."""
    nvml, reserved = m.get("nvml_process_used_bytes"), m.get("cuda_reserved_at_stop_bytes")
    return None if nvml is None or reserved is None else nvml - reserved
