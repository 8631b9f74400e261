"""Which setups this machine runs as asked: a point that cannot run as its Setup says is recorded
``unsupported`` with the reason, never silently trained some other way."""

from __future__ import annotations

from ..point.case import Case
from .optimizers import optimizer_refusal


def refusal(case: Case) -> str | None:
    """Why this point is not run here as asked, or None."""
    setup = case.setup
    if case.compiled and (setup.loop != "manual" or case.world_size > 1 or setup.lora is not None):
        return ("a compile-budget point runs torch.compile in the plain single-process loop only; the "
                f"{setup.loop} loop{', LoRA' if setup.lora else ''}{' and more than one rank' if case.world_size > 1 else ''}"
                " around a compiled model are not built by this version of ckptbench")
    if setup.autocast == "fp16" and case.device == "cpu":
        # Accelerate (and so Trainer) neither autocasts nor scales fp16 on CPU
        # (``Accelerator(mixed_precision='fp16', cpu=True).native_amp`` is False: the point would silently
        # train in fp32), and the manual loop's CPU fp16 matmuls convert through fp32 scratch buffers below
        # torch's dispatcher, which the exact tracker cannot see (the allocator meter saw 25,728 B more than
        # the tracker on llama-tiny at batch 2, seq 32)
        return ("fp16 mixed precision is not run on CPU: accelerate and Trainer do not autocast or scale fp16 "
                "there (the point would silently train in fp32), and CPU fp16 matmuls use scratch buffers the "
                "exact memory tracker cannot see; bf16-mixed runs on CPU, fp16-mixed on CUDA")
    if setup.lora is not None and setup.lora.quantize:
        return qlora_refusal(setup.lora.quantize)
    if setup.lora is not None and case.world_size > 1:
        return "LoRA adapters on more than one rank are not built by this version of ckptbench yet"
    if setup.sharding == "fsdp" and setup.autocast and setup.autocast != "bf16":
        # bf16-mixed is FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); fp16 would also
        # need a sharded gradient scaler
        return (f"fsdp points run {setup.autocast}-mixed only as bf16-mixed (FSDP2's MixedPrecisionPolicy): "
                "fp16 under FSDP2 needs a sharded gradient scaler, not built by this version of ckptbench")
    if setup.sharding == "fsdp" and setup.loop != "manual":
        return (f"fsdp points run the plain FSDP2 loop; the {setup.loop} loop over fully_shard is not built "
                "by this version of ckptbench")
    return optimizer_refusal(setup)


def qlora_refusal(quantize: str) -> str:
    """Why a QLoRA point (the frozen base quantized, e.g. NF4) is not run: ckptbench does not depend on
    bitsandbytes, and does not build the quantized base yet where it is installed."""
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        return (f"QLoRA ({quantize}) needs bitsandbytes' 4-bit layers, and bitsandbytes is not installed here "
                "(ckptbench does not depend on it)")
    return f"QLoRA ({quantize}): the 4-bit base through bitsandbytes is not built by this version of ckptbench yet"
