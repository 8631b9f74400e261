"""Page faults a CPU step takes in memory its ops' microbenchmarks never meet, and what one costs.

An op timed back to back (:mod:`.oprates`) frees its output before the next call and gets the same memory
back from glibc, already mapped.  The step allocates thousands of tensors in a different order: glibc
gives heap above its trim threshold back to the kernel and maps it again later, and every page the
step then writes first is a minor fault (on this project's 2-core machine about 2.5 µs: a 4 KiB page
zeroed).  A gpt2-tiny step of 16 × 2048 tokens took ~640,000 such faults, 1.6 s of a 5.9 s step that the
ops' timings did not contain.

Which allocations fault depends on glibc's whole history of the step, so it is not modelled: it is
*replayed*.  :func:`replay_allocations` makes the step's allocations and frees (the allocator meter's
events, in order, each a size: :class:`.allocator.AllocatorMeter`) through torch's own CPU allocator,
writes one byte of every page of each new block (the op that made it writes all of it), frees each block
where the step freed one of its size, and counts the minor faults (``getrusage``).  :func:`fault_price` is
the seconds per fault: a fresh anonymous mapping, every page written once, its time over its faults.
The ops' own timings fault too where their outputs are mapped afresh each call (blocks beyond glibc's mmap
threshold), so the step-time model adds only the replay's faults beyond those
(:func:`ckptbench.theory.steptime.step_cost`).
"""

from __future__ import annotations

import mmap
import resource

PAGE = mmap.PAGESIZE
PRICE_BYTES = 64 * 2**20  # the fresh mapping fault_price writes: 16,384 pages


def minor_faults() -> int:
    """This process's minor page faults so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def replay_allocations(sequence: list[int]) -> int:
    """The minor faults the step's allocations take, replayed (see the module's text): `sequence` is each
    allocator event's bytes in order, + allocated, − freed; a free of a size with no block of that size
    live in the replay (a tensor made before the step) is skipped.  Every block is freed at the end."""
    import torch

    live: dict[int, list] = {}
    before = minor_faults()
    for nbytes in sequence:
        if nbytes > 0:
            block = torch.empty(nbytes, dtype=torch.uint8)
            block[::PAGE].fill_(1)
            live.setdefault(nbytes, []).append(block)
        elif live.get(-nbytes):
            live[-nbytes].pop()
    faults = minor_faults() - before
    live.clear()
    return faults


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
