"""Print the accuracy table of docs/precision-and-loops.md: each point measured on this CPU beside the
simulation of the same step (``python scripts/precision_table.py > table.md``; a few minutes on 2 cores)."""

from __future__ import annotations

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import PRECISIONS, Setup
from ckptbench.point.strategy import checkpointing_name
from ckptbench.point.training import TrainSpec
from ckptbench.run.worker import measure
from ckptbench.theory.memory.estimate import estimate_case
from ckptbench.theory.memory.simulate import simulate

STRATEGIES = ((0, False), (2, False), (1, False), (1, True))


def row(name: str, precision: str, loop: str, every_n: int, offload: bool, batch: int = 2, seq: int = 64) -> str:
    dtype, autocast = PRECISIONS[precision]
    case = Case(model=preset(name, dtype=dtype, attn="sdpa"), train=TrainSpec(warmup_steps=1, steps=1),
                batch_size=batch, seq_len=seq, every_n_layers=every_n, offload=offload,
                setup=Setup(autocast=autocast, loop=loop))
    m = measure(case)
    s = simulate(case.model, batch, seq, every_n, offload, setup=case.setup)
    same = all(m[k] == getattr(s, k) for k in ("mem_after_forward_bytes", "peak_bytes", "peak_phase"))
    est = estimate_case(case).peak_bytes if case.analytic else None
    return (f"| {name} | {precision} | {loop} | {checkpointing_name(every_n, offload)} | "
            f"{m['mem_after_forward_bytes']:,} | {s.mem_after_forward_bytes:,} | {m['peak_bytes']:,} | "
            f"{s.peak_bytes:,} | {'–' if est is None else f'{est:,}'} | {m['peak_phase']} | "
            f"{'equal' if same else 'DIFFERENT'} |")


def main() -> None:
    print("| model | precision | loop | strategy | after forward, measured B | simulated B | peak, measured B "
          "| simulated B | analytic estimate B | peak phase | measured = simulated |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---|---|")
    points = [(name, "bf16-mixed") for name in ("llama-tiny", "qwen2-tiny", "gpt2-tiny")] + [("llama-tiny", "fp32")]
    for name, precision in points:
        for loop in ("manual", "trainer", "accelerate"):
            for n, off in STRATEGIES:
                print(row(name, precision, loop, n, off), flush=True)


if __name__ == "__main__":
    main()
