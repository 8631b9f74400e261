"""Print a step's minor page faults beside two replays of its allocations: torch's tensors alone, and every malloc.

    python scripts/heap_trim_replay.py PRESET LAYERS BATCH SEQ EVERY_N [--rounds N]

The step is the step-time grid's (docs/step-time-model.md): the manual loop, AdamW, sdpa, one thread,
checkpointing through transformers' API.  Each round takes three steps, each followed by one measurement:

- a step's own faults, its every malloc, calloc, realloc, aligned allocation and free logged meanwhile
  (:mod:`ckptbench.measure.malloclog`, built with ``cc`` and preloaded: this script runs itself again under
  ``LD_PRELOAD``);
- the tensor replay the step-time model prices (:func:`ckptbench.measure.heapfaults.replay_priced`): the
  allocation events torch's CPU allocator reported for one step (:class:`ckptbench.measure.allocator.
  AllocatorMeter`, taken once, before the rounds);
- the replay of the round's whole malloc log, every block's pages written once (what the sweep's rate rounds
  replay, logged there over the memory step), with the replay's own time.

Medians over the rounds are printed last.  Needs a C compiler and glibc.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def preload() -> None:
    """Build the malloc log and run this script again with it preloaded (once)."""
    from ckptbench.measure.malloclog import build, preload_env

    library, why = build()
    env = dict(os.environ)
    why = why or preload_env(env, library)
    if why:
        sys.exit(f"heap_trim_replay: {why}")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main() -> None:
    from gridstep import add_step_arguments

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(p)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--profiled", action="store_true",
                   help="log each round's step under torch's profiler, as the sweep's memory step runs")
    args = p.parse_args()
    from ckptbench.measure.malloclog import MallocLog

    log = MallocLog.loaded()
    if log is None:
        preload()

    from gridstep import grid_step

    from ckptbench.measure.allocator import AllocatorMeter
    from ckptbench.measure.heapfaults import minor_faults, replay_priced

    _, step = grid_step(args.preset, args.layers, args.batch, args.seq, args.every_n)
    for _ in range(3):
        step()
    meter = AllocatorMeter()
    meter.start()
    step()
    meter.stop()
    tensors = sum(1 for b in meter.sequence if b > 0)
    print(f"{args.preset} every_n={args.every_n} b{args.batch} s{args.seq}: {tensors} tensor allocations a step")
    print(f"{'round':>5s} {'step':>9s} {'tensor replay':>14s} {'malloc replay':>14s} {'calls':>7s} {'replay s':>9s}")
    rows = []
    for r in range(args.rounds):
        if args.profiled:  # the logged step is the profiled one; the faults counted, the next (plain) one's
            log.start()
            meter = AllocatorMeter()
            meter.start()
            step()
            meter.stop()
            log.stop()
        else:
            log.start()
        f0 = minor_faults()
        step()
        stepped = minor_faults() - f0
        if not args.profiled:
            log.stop()
        step()
        tensor, _ = replay_priced(meter.sequence)
        step()
        t0 = time.thread_time()
        faults, _, _ = log.replay(time.thread_time)
        took = time.thread_time() - t0
        rows.append((stepped, tensor, faults))
        print(f"{r:5d} {stepped:9d} {tensor:14d} {faults:14d} {log.events:7d} {took:9.4f}", flush=True)
    medians = [statistics.median(c) for c in zip(*rows)]
    print(f"{'median':>5s} {medians[0]:9.0f} {medians[1]:14.0f} {medians[2]:14.0f}")


if __name__ == "__main__":
    main()
