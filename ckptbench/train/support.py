"""Which setups this machine runs as asked: a point that cannot run as its Setup says is recorded
``unsupported`` with the reason, never silently trained some other way."""

from __future__ import annotations

from ..spec import Case
from .optimizers import optimizer_refusal


def refusal(case: Case) -> str | None:
    """Why this point is not run here as asked, or None."""
    setup = case.setup
    if setup.autocast == "fp16" and case.device == "cpu":
        # Accelerate (and so Trainer) neither autocasts nor scales fp16 on CPU
        # (``Accelerator(mixed_precision='fp16', cpu=True).native_amp`` is False: the point would silently
        # train in fp32), and the manual loop's CPU fp16 matmuls convert through fp32 scratch buffers below
        # torch's dispatcher, which the exact tracker cannot see (the allocator meter saw 25,728 B more than
        # the tracker on llama-tiny at batch 2, seq 32)
        return ("fp16 mixed precision is not run on CPU: accelerate and Trainer do not autocast or scale fp16 "
                "there (the point would silently train in fp32), and CPU fp16 matmuls use scratch buffers the "
                "exact memory tracker cannot see; bf16-mixed runs on CPU, fp16-mixed on CUDA")
    if setup.lora is not None:
        return "LoRA adapters are not built by this version of ckptbench yet"
    if setup.sharding != "ddp":
        return f"sharding {setup.sharding!r} is not built by this version of ckptbench yet"
    return optimizer_refusal(setup)
