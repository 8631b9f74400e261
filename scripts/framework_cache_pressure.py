"""Print how a probe-sized step's time beside its kernels grows when its caches are emptied between modules.

    python scripts/framework_cache_pressure.py [--steps N]

A llama of hidden 32 and 2 layers (the framework probe's size: docs/step-time-model.md), 1 × 16 tokens,
one thread, AdamW, no checkpointing.  For each read size, every forward of a leaf module of its decoder
layers that runs a kernel is preceded by a read of a buffer that size
(:class:`ckptbench.measure.cachescrub.CacheScrub`), the reads' own time taken out; the median step of
`--steps` is printed.  The first row reads nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ckptbench.measure.cachescrub import CacheScrub
    from ckptbench.measure.optrace import OpRecorder

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=128,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 64, (1, 16))

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    recorder = OpRecorder()
    scrub = CacheScrub(list(model.model.layers), time.perf_counter, ops=recorder.kernel_calls)
    for _ in range(5):
        step()
    scrub.counting()
    with recorder:
        step()
    scrub.off()
    print(f"{scrub.calls} module calls a step read before; {torch.__version__}, 1 thread")
    print("| read before each module | step less its reads (median) |\n| ---: | ---: |")
    for kib in (0, 64, 256, 512, 1024, 2048, 4096, 8192):
        times = []
        for _ in range(args.steps):
            if kib:
                scrub.reading(kib * 1024)
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0 - (scrub.spent_s if kib else 0.0))
            scrub.off()
        print(f"| {kib} KiB | {statistics.median(times) * 1e3:.2f} ms |")


if __name__ == "__main__":
    main()
