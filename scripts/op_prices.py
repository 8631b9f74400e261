"""Each op's price in the step-time model beside the same op's own time inside the real step.

    python scripts/op_prices.py PRESET LAYERS BATCH SEQ EVERY_N [--rates-dir DIR]

The step is traced on fake tensors and priced at op rates timed here (as a sweep's worker prices its own
step: :func:`ckptbench.run.steptime.measured_rates`, kept in DIR); then the real step (the manual loop,
AdamW, sdpa, 1 thread, checkpointing through transformers' API) is timed three times and profiled twice
with ``torch.profiler``, whose self CPU time per op is what the op cost where it ran.  Rows are sorted by
the gap between the two.  A composite op (``clone``, ``zeros``) is priced whole but profiled in its parts
(``copy_``, ``fill_``): compare sums, not single rows, for those.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time


def main() -> None:
    from gridstep import add_step_arguments

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(p)
    p.add_argument("--rates-dir", default="/tmp/ckptbench-op-prices")
    args = p.parse_args()

    import torch
    from gridstep import grid_case, grid_step, self_seconds

    from ckptbench.run.ratecache import RateCache, machine_facts
    from ckptbench.run.steptime import measured_rates
    from ckptbench.theory.optrace import trace_case
    from ckptbench.theory.steptime import entry_seconds, step_cost

    torch.set_num_threads(1)
    case = grid_case(args.preset, args.layers, args.batch, args.seq, args.every_n)
    entries = trace_case(case)
    rates, _ = measured_rates(case, entries, RateCache(args.rates_dir, machine_facts("cpu", 1)))
    cost = step_cost(entries, rates)
    priced: collections.Counter = collections.Counter()
    for e in entries:
        op = str(e["op"])
        op = "aten::" + op.split(".")[1] if op.startswith("aten.") else op
        priced[op] += sum(e["counts"].values()) * entry_seconds(e, rates)[0]

    _, step = grid_step(args.preset, args.layers, args.batch, args.seq, args.every_n)
    step()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    inside = self_seconds(step)
    print(f"{case.model.label} {case.strategy} b{args.batch} s{args.seq}: step median {statistics.median(times):.4f} s "
          f"(3 timed), predicted {cost.seconds:.4f} s (kernels {cost.kernel_s:.4f}, framework {cost.framework_s:.4f})")
    print(f"{'op':58s} {'priced s':>9s} {'in step s':>9s}")
    for op in sorted(set(priced) | set(inside), key=lambda k: -abs(priced.get(k, 0) - inside.get(k, 0)))[:30]:
        print(f"{op[:58]:58s} {priced.get(op, 0):9.4f} {inside.get(op, 0):9.4f}")


if __name__ == "__main__":
    main()
