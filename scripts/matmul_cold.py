"""A step's matmuls priced three ways beside their own time inside the real step: hot, after a read that
evicts the core's L2, and after a read that evicts the L3 too.

    python scripts/matmul_cold.py PRESET LAYERS BATCH SEQ EVERY_N [--l2-read MIB] [--l3-read MIB] [--reps N]

Timed back to back, an op's operands sit in the core's caches; in the step a small
matmul's weight was last touched a whole layer ago.  Here every matmul entry of the traced step is timed
(CPU time of this thread, one thread) back to back on one set of tensors, and one call at a time after reading
a buffer (a read leaves no dirty lines for the call to write back): one a little larger than the L2, and
one larger than the L3.  The real step is profiled twice with ``torch.profiler``; its matmuls' self CPU time
is what they cost where they ran.  Each column sums an entry's price times its calls in the step.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def main() -> None:
    from gridstep import add_step_arguments

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(p)
    p.add_argument("--l2-read", type=float, default=2.0, help="MiB read before each call: past the L2")
    p.add_argument("--l3-read", type=float, default=96.0, help="MiB read before each call: past the L3")
    p.add_argument("--reps", type=int, default=60)
    args = p.parse_args()

    import torch
    from gridstep import grid_case, grid_step, self_seconds

    from ckptbench.measure.oprates import entry_call, time_call
    from ckptbench.theory.optrace import trace_case

    torch.set_num_threads(1)
    case = grid_case(args.preset, args.layers, args.batch, args.seq, args.every_n)
    entries = [e for e in trace_case(case) if e["kind"] == "matmul"]

    def after_read(call, nbytes: int) -> float:
        buf = torch.ones(nbytes // 4)
        seconds = []
        for _ in range(args.reps):
            buf.sum()
            t0 = time.thread_time()
            call()
            seconds.append(time.thread_time() - t0)
        return statistics.median(seconds)

    rows = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for e in entries:
        calls = sum(e["counts"].values())
        _, call = entry_call(e, "cpu")
        with torch.no_grad():
            hot = time_call(call, "cpu")  # on one set of tensors (time_entry takes a matmul's other operands cold)
            l2 = after_read(call, int(args.l2_read * 2**20))
            l3 = after_read(call, int(args.l3_read * 2**20))
        op = "aten::" + e["op"].split(".")[1]
        for i, v in enumerate((hot, l2, l3)):
            rows[op][i] += calls * v

    _, step = grid_step(args.preset, args.layers, args.batch, args.seq, args.every_n)
    for _ in range(3):
        step()
    inside = {op: s for op, s in self_seconds(step).items() if op in MATMUL_OPS}
    print(f"{args.preset} x{args.layers} every-{args.every_n} b{args.batch} s{args.seq}: matmul seconds a step")
    print(f"{'op':14s} {'hot':>8s} {'L2 cold':>8s} {'L3 cold':>8s} {'in step':>8s}")
    total = [0.0] * 4
    for op in sorted(set(rows) | set(inside)):
        values = [*rows.get(op, [0.0] * 3), inside.get(op, 0.0)]
        total = [t + v for t, v in zip(total, values)]
        print(f"{op:14s} " + " ".join(f"{v * 1e3:8.2f}" for v in values))
    print(f"{'all':14s} " + " ".join(f"{v * 1e3:8.2f}" for v in total) + "  (ms)")


if __name__ == "__main__":
    main()
