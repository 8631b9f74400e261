"""Train-step benchmarks of representative Cases, built and measured by the real harness.

Each benchmark does two things with one Case:

1. ``worker.measure(case)`` in this process: the harness's own warm-up, memory and timed steps.  Its
   memory numbers (exact live-storage peak on CPU, saved-tensor counts) go into ``extra_info``, where
   ``ckptbench compare`` reads them.
2. A fresh model built by the same functions the worker uses, then one training step per round in
   pytest-benchmark's pedantic mode (fixed rounds after warm-up rounds, one step per round), so the
   benchmark's median *is* a median step time and tokens/s follows from it.

Memory meters never run during the timed rounds (the worker's rule: probes slow the step).
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run.worker import measure
from ckptbench.train.checkpointing import enable_checkpointing, offload_without_pinning, pinned_memory_error
from ckptbench.train.models import build_model, synthetic_batch
from ckptbench.train.step import train_step

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
WARMUP_ROUNDS = 3
TRAIN = TrainSpec(warmup_steps=1, memory_steps=1, steps=5, seed=0, threads=1)

# (preset, batch, seq, every_n_layers, offload, rounds): every strategy on the tiny Llama, a larger Llama
# where recompute costs real time, and the other two families once with full checkpointing.  Tiny steps
# (tens of ms on one CPU thread) get more rounds so their median is worth comparing; about 2-8 s each.
POINTS = [
    ("llama-tiny", 2, 64, 0, False, 50),
    ("llama-tiny", 2, 64, 2, False, 50),
    ("llama-tiny", 2, 64, 1, False, 50),
    ("llama-tiny", 2, 64, 1, True, 50),
    ("llama-small", 2, 256, 0, False, 15),
    ("llama-small", 2, 256, 1, False, 15),
    ("qwen2-tiny", 2, 64, 1, False, 50),
    ("gpt2-tiny", 2, 64, 1, False, 50),
]
CASES = [(Case(preset(name), TRAIN, batch, seq, every, offload, device=DEVICE), rounds)
         for name, batch, seq, every, offload, rounds in POINTS]
MEMORY_KEYS = ("peak_bytes", "mem_after_forward_bytes", "activations_after_forward_bytes", "saved_bytes",
               "checkpointed_input_bytes", "offloaded_bytes")


def _case_id(case: Case) -> str:
    return f"{case.model.label}-{case.strategy}-b{case.batch_size}-s{case.seq_len}"


def _offload_context(case: Case):
    """The worker's workaround for torch builds without pinned memory, applied the same way."""
    return offload_without_pinning() if case.offload and pinned_memory_error() else nullcontext()


@pytest.mark.parametrize("case, rounds", CASES, ids=[_case_id(c) for c, _ in CASES])
def test_train_step(benchmark, case: Case, rounds: int):
    measured = measure(case)

    torch.manual_seed(case.train.seed)
    with _offload_context(case):
        model = build_model(case.model, case.device)
        enable_checkpointing(model, case.every_n_layers, case.offload)
        optimizer = torch.optim.AdamW(model.parameters(), lr=case.train.lr)
        batch = synthetic_batch(case.model.vocab, case.batch_size, case.seq_len, case.train.seed, case.device)
        sync = torch.cuda.synchronize if case.device == "cuda" else (lambda: None)

        def step():
            train_step(model, optimizer, batch, case.grad_accum)
            sync()

        benchmark.pedantic(step, rounds=rounds, warmup_rounds=WARMUP_ROUNDS, iterations=1)

    median = benchmark.stats.stats.median
    benchmark.extra_info.update(
        case_id=case.id,
        strategy=case.strategy,
        device=case.device,
        tokens_per_step=case.tokens_per_step,
        tokens_per_s=case.tokens_per_step / median if median > 0 else None,
        worker_step_time_median_s=measured["step_time_median_s"],
        recomputed_layers=measured.get("recomputed_layers"),
        memory_probe=measured.get("memory_probe"),
        **{key: measured.get(key) for key in MEMORY_KEYS},
    )
    assert measured["peak_bytes"] > 0
    assert sorted(measured.get("recomputed_layers", [])) == case.checkpointed_layers
