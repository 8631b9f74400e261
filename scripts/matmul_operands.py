"""Each grid point's matmuls timed back to back and with their other operands from beyond the caches, and
earlier grids priced again with the difference.

    python scripts/matmul_operands.py [--runs 39-43] [DIR]

For every point of ``scripts/step_time_accuracy.py``'s grid, the step is traced on fake tensors and each of
its matmul entries timed two ways (CPU time of this thread, one thread): back to back on one set of
tensors, as the step-time model timed every op before, and as it does now
(:func:`ckptbench.measure.oprates.time_entry`: its first matrix as made, its other operands from the next
places of a pool twice the last-level cache).  Each column sums an entry's time times its calls in the step.
Then each run of ``--runs`` under DIR (default ``results/reference-step-time-accuracy``), whose predictions
were made the first way, is priced again: each point's recorded matmul seconds times (the ratio of the
two columns - 1) added to its prediction, against its measured median step.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from step_time_accuracy import MODELS, TOLERANCE, points
from step_time_repeatability import read_run, span


def matmul_seconds(case) -> tuple[float, float]:
    """(back to back, other operands from beyond the caches): the step's matmul seconds."""
    import torch

    from ckptbench.measure.oprates import entry_call, time_call, time_entry
    from ckptbench.theory.optrace import trace_case

    hot = cold = 0.0
    for e in trace_case(case):
        if e["kind"] != "matmul":
            continue
        calls = sum(e["counts"].values())
        _, call = entry_call(e, "cpu")
        with torch.no_grad():
            hot += calls * time_call(call, "cpu")
        cold += calls * time_entry(e)
    return hot, cold


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="39-43")
    p.add_argument("dir", nargs="?", default="results/reference-step-time-accuracy")
    args = p.parse_args()

    import torch
    from gridstep import grid_case

    torch.set_num_threads(1)
    ratio = {}
    print("| point | back to back (ms) | other operands cold (ms) | ratio |\n| --- | ---: | ---: | ---: |")
    for index, (model, (preset, layers)) in enumerate(MODELS.items()):
        for every_n, offload, batch, seq in points(index):
            case = grid_case(preset, layers, batch, seq, every_n, offload)
            hot, cold = matmul_seconds(case)
            name = f"{case.strategy}-b{batch}-s{seq}"  # as step_time_accuracy.py names the point's folder
            ratio[(model, name)] = cold / hot
            print(f"| {model} {name} | {hot * 1e3:.2f} | {cold * 1e3:.2f} | {cold / hot:.3f} |", flush=True)

    print("\n| run | within ±10 % as recorded | priced again | mean error as recorded | priced again |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for run in span(args.runs):
        before, after = [], []
        for key, r in read_run(Path(args.dir), run).items():
            if key not in ratio or r["matmul"] is None:
                continue
            before.append(r["predicted"] / r["measured"] - 1)
            after.append((r["predicted"] + r["matmul"] * (ratio[key] - 1)) / r["measured"] - 1)
        if before:
            hits = [sum(abs(e) <= TOLERANCE for e in errors) for errors in (before, after)]
            print(f"| {run} | {hits[0]} of {len(before)} | {hits[1]} of {len(after)} | "
                  f"{100 * statistics.mean(before):+.1f} % | {100 * statistics.mean(after):+.1f} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
