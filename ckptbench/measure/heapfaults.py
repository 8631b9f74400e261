"""Page faults a CPU step takes in memory its ops' microbenchmarks never meet, and what one costs.

An op timed back to back (:mod:`.oprates`) frees its output before the next call and gets the same memory
back from glibc, already mapped.  The step allocates thousands of tensors in a different order: glibc
gives heap above its trim threshold back to the kernel and maps it again later, and every page the
step then writes first is a minor fault (on this project's 2-core machine about 2.5 µs: a 4 KiB page
zeroed).  A gpt2-tiny step of 16 × 2048 tokens took ~640,000 such faults, 1.6 s of a 5.9 s step that the
ops' timings did not contain.

Which allocations fault depends on glibc's whole history of the step, so it is not modelled: it is
*replayed*.  Where the workers have it preloaded, :mod:`.malloclog` replays the step's every malloc (the
tensors are a tenth of them, and the rest decide where glibc's heap trims); this module's replay of the
tensors alone is what a worker without it gets.  :func:`replay_priced` makes the step's allocations and frees (the allocator meter's
events, in order, each a size: :class:`.allocator.AllocatorMeter`) through torch's own CPU allocator,
writes one byte of every page of each new block (the op that made it writes all of it), frees each block
where the step freed one of its size, and counts the minor faults (``getrusage``); it also times the
blocks that faulted, the step's faults at their price in the step's own pattern.
:func:`fault_price` is the seconds per fault on a fresh anonymous mapping, every page written once: the
price of the faults an op takes in its own timing, each call's output mapped where the last call's was.
The ops' own timings fault too where their outputs are mapped afresh each call (blocks beyond glibc's mmap
threshold): the rate rounds take those faults off each op's time at the fresh mapping's price, and the
step-time model prices every replayed fault at the replay's own (:mod:`ckptbench.run.raterounds`,
:func:`ckptbench.theory.steptime.step_cost`).
"""

from __future__ import annotations

import mmap
import resource

PAGE = mmap.PAGESIZE
PRICE_BYTES = 64 * 2**20  # the fresh mapping fault_price writes: 16,384 pages


def minor_faults() -> int:
    """This process's minor page faults so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def replay_priced(sequence: list[int], clock=None) -> tuple[int, float]:
    """The minor faults the step's allocations take, replayed (see the module's text): `sequence` is each
    allocator event's bytes in order, + allocated, − freed; a free of a size with no block of that size
    live in the replay (a tensor made before the step) is skipped.  Every block is freed at the end.  With
    them, the seconds by `clock` (default ``time.perf_counter``) that the faulting blocks took: each block
    that faulted, made and written, and freed.  Their ratio is what a fault
    costs in the step's own pattern of allocations, which on a virtual machine can be several times a fresh
    mapping's price (:func:`fault_price`): there a page the guest freed may have been handed back to the host
    (free page reporting) and the next fault on it is the host's too.  llama-small none 16 × 2048 on this
    project's 2-core VM: 4.7–6.0 µs a fault replayed, 1.7–2.4 µs on a fresh 64 MiB mapping, ~5 µs implied by
    its steps; gpt2-tiny every-2 16 × 2048: 2.0–3.3 µs replayed and 2.4–3.3 µs fresh."""
    import time

    import torch

    clock = clock or time.perf_counter
    live: dict[int, list] = {}
    faults, seconds = 0, 0.0
    for nbytes in sequence:
        if nbytes > 0:
            f0, t0 = minor_faults(), clock()
            block = torch.empty(nbytes, dtype=torch.uint8)
            block[::PAGE].fill_(1)
            took, spent = minor_faults() - f0, clock() - t0
            if took:
                faults, seconds = faults + took, seconds + spent
            live.setdefault(nbytes, []).append((block, took))
            del block
        elif live.get(-nbytes):
            t0 = clock()
            took = live[-nbytes].pop()[1]  # the block's last reference goes: freed (a mapped one unmapped) here
            if took:
                seconds += clock() - t0
    live.clear()
    return faults, seconds


def fault_price(clock) -> float | None:
    """Seconds per minor fault by `clock` (:func:`.oprates.clock`): a fresh anonymous mapping of
    :data:`PRICE_BYTES`, one byte of every page written; None where the kernel reported no fault."""
    import torch

    area = mmap.mmap(-1, PRICE_BYTES)
    try:
        pages = torch.frombuffer(area, dtype=torch.uint8)
        before, t0 = minor_faults(), clock()
        pages[::PAGE].fill_(1)
        seconds, faults = clock() - t0, minor_faults() - before
        del pages
    finally:
        area.close()
    return seconds / faults if faults > 0 else None
