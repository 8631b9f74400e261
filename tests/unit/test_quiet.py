"""The C++ lines kept off the terminal while a measurement runs: the profiler's and the CPU allocator's, as
one process writes them and as torchrun prefixes them with the rank; every other line comes out."""

from __future__ import annotations

import os

from ckptbench.measure.quiet import Quiet

LINES = [b"USDT: profiler_start\n",
         b"[W1207 09:08:03.326950054 CPUAllocator.cpp:245] Memory block of unknown size was allocated before "
         b"the profiling started, profiler results will not include the deallocation event\n",
         b"[rank1]:[W1207 09:08:03.319401746 CPUAllocator.cpp:245] Memory block of unknown size was allocated "
         b"before the profiling started, profiler results will not include the deallocation event\n",
         b"[rank0]:USDT: profiler_stop\n"]


def test_the_known_lines_are_dropped_with_or_without_a_rank_and_the_users_kept(capfd):
    quiet = Quiet(fds=(2,))
    with quiet:
        for line in LINES:
            os.write(2, line)
        os.write(2, b"[rank1]: the user's own line\n")
    assert quiet.dropped == len(LINES)
    assert capfd.readouterr().err == "[rank1]: the user's own line\n"
