"""Op rates timed between a point's timed steps, so that the step-time model prices the step under the
conditions its steps ran in.

A shared machine's speed moves while a point runs: on this project's 2-core machine a 512×512 matmul on
one thread took 2.6 ms for a few seconds, then 3.4 ms for the next few (p90/p10 of 40 readings a tenth of
a second apart: 1.34; a copy's 1.35), so the same point measured twice differed by up to 30 %.  Rates timed
after the steps, or at an earlier point, price the step at another minute's speed, and that alone moved
predictions by ±30 % against the steps they were checked against.

:class:`RateRounds` times every op the memory step ran (each distinct entry of its trace once, one trial:
:func:`ckptbench.measure.oprates.measure_entries`) in *rounds*, each right after a timed step, outside the step's
timer; the prediction takes each entry's median over the rounds.  Steps and rounds alternate, as the
framework probe's steps and microbenchmarks do (:mod:`.steptime`), so both sample the same conditions.  A
round runs after the first timed step, then whenever the rounds so far have cost less than :data:`SHARE` of
the timed steps' time, so the timing window grows by about that share.  Beyond the share a point still gets
:data:`FIRST_ROUNDS` rounds spread over the steps it is expected to time (:meth:`.StopRule.expected_steps`,
at the mean step so far) and :data:`MIN_ROUNDS` spread over its step cap.  A point whose steps take seconds
stops at its minimum of three: its ops are then priced from a round after each step, not from the one or
two that the share admits (a round costs one to two of its steps).  One round misread the machine's speed
by 20 % (llama-small 16 × 2048: 8.5 s of kernels priced in its one round, 6.8–8.0 s in other runs, against
steps 40 % faster than those runs').  Spread, not bunched after the first steps: a 1.7 s step times a dozen
steps, and three rounds after its first three priced it at the slower speed those steps ran at (+15.5 %,
its later steps 20 % faster).  Every round also replays the step's allocations twice for their page faults
(where the workers have the malloc log preloaded, :mod:`ckptbench.measure.malloclog`, every malloc and free
of the first timed step; else the memory step's tensor allocations,
:func:`ckptbench.measure.heapfaults.replay_priced`) and times the blocks that faulted: first, for how
many faults, before anything else in the round allocates, glibc's heap as the step left it (after the ops'
timings it counted 14-24 % more than llama-small 16 × 2048's steps took, right after the step 0.9-1.15 of
them); last, after the ops' timings, for what a fault costs, the step's freed memory then as long unused as
the next step finds it (on a virtual machine whose host takes back what the guest frees, a fault right
after the step cost 3.0-3.4 µs and one after the ops' timings 3.3-4.2, its steps' ~3.2-5.4).  The median
count, and all rounds' last replays' seconds over their faults.  It prices a fault on a fresh mapping, times
one copy and one in-place pass beyond the caches (the floor of a memory-bound op; the copy's buffers made
before the first timed step, so that none of them is still in the cache) and lets the framework probe take
one step, and a second with the point's forward traffic read between its
modules (:mod:`.probethread`).  An op's time in a round is kept less the page
faults it took in that round's timing, at the price that round measured: whether a large output is mapped
afresh when timed depends on what glibc's heap holds then (gpt2-tiny every-2 16 × 2048: 697,000 faults in
its ops' timings in one round, none in another run's), and the replay prices the step's faults whole.  On a
CPU only (:meth:`RateRounds.use`).  The steps' own times are unchanged by the rounds between them (measured:
the median step after a round over the median step back to back, 0.93 to 1.02 on three models, three times
each).
"""

from __future__ import annotations

import statistics
import time

from ..measure.malloclog import MallocLog

SHARE = 0.5  # the rounds' time, at most, as a share of the timed steps' time (after the first round)
# rounds a point gets beyond its share, spread over the steps it is expected to time (see the module's text)
FIRST_ROUNDS = 3
# rounds a point gets beyond its share, spread over its step cap: a short step's framework and kernels are
# priced from this many samples of the machine's moving speed at least (when its steps reach the cap)
MIN_ROUNDS = 10


class RateRounds:
    """Rounds of op timings between timed steps (see the module's text).  :meth:`offer` after each timed
    step; :meth:`result` the entries' medians."""

    def __init__(self, device: str, rule=None, case=None, deadline: float | None = None):
        self.device = device
        self.rule = rule  # the point's StopRule (measure/stopping.py): the steps it is expected to time
        # a perf_counter moment: no round beyond the share starts that would end after it, at a round's mean cost
        self.deadline = deadline
        self.case = case  # its architecture is probed for the framework's time in each round (.probethread)
        self.probe = None
        self.bandwidths: list[float] = []  # bytes/s of a copy beyond the caches, one per round
        self.inplace: list[float] = []  # bytes/s an in-place op spans beyond the caches, one per round
        self._buffers = None  # the copy's, kept from round to round (False: they could not be had)
        self.entries: list[dict] | None = None  # the memory step's op trace, once it has run
        self.per_key: dict[str, list[tuple[float, float, int]]] = {}  # (seconds, faults per call, round)
        self.sequence: list[int] | None = None  # the memory step's allocations, for the heap-fault replay
        self.malloc_log = None  # every malloc of the first timed step (measure/malloclog.py), where preloaded
        self._logging = False
        self.replays: list[tuple[int, float]] = []  # each round's replay first in it: faults, their seconds
        self.repriced: list[tuple[int, float]] = []  # each round's replay at its end: faults, their seconds
        self.prices: list[float | None] = []  # seconds per minor fault, one per round (None: none reported)
        self.rounds = 0
        self.spent_s = 0.0

    def use(self, trace: list[dict] | None, sequence: list[int] | None = None) -> None:
        """The ops to time: the memory step's trace (None: no rounds), and its allocator events' bytes in
        order (`sequence`: replayed in every round, for its page faults and their price).  Where the fork
        server preloaded the malloc log (:class:`~ckptbench.measure.malloclog.MallocLog`), the first timed
        step's every malloc is replayed instead (:meth:`before_step`).  Only on a CPU:
        on CUDA a round's tensors would stay in the caching allocator's reserve, which the record measures,
        and emptying it would slow the next step; a dedicated card's speed does not move as a shared CPU's
        does."""
        self.entries = [e for e in trace if e["kind"] != "view"] if trace and self.device == "cpu" else None
        self.sequence = sequence if self.entries is not None else None
        self.malloc_log = MallocLog.loaded() if self.entries is not None else None
        if self.entries is not None and self._buffers is None:
            # made now, before the timed steps: buffers just written sit in the last-level cache (480 MiB on
            # this project's VM), and a first round's copy on them read 12 GB/s where the long points' other
            # rounds read 5-9
            from ..measure.oprates import copy_buffers

            try:
                self._buffers = copy_buffers(self.device)
            except (RuntimeError, MemoryError):  # a point near its memory cap: the figures measured once stand
                self._buffers = False

    def due(self, steps_s: float, step: int = 0) -> bool:
        """After timed step `step` (from 1; `steps_s` the steps' seconds so far): the first round, then while
        the rounds have cost less than their share of the steps' time, or while there are fewer than
        FIRST_ROUNDS (spread over the steps the point is expected to time) or MIN_ROUNDS (over its step cap)
        and the step is past its turn.  No round beyond the share starts that would end past the deadline at
        the rounds' mean cost."""
        if self.entries is None:
            return False
        if self.rounds == 0 or self.spent_s < SHARE * steps_s:
            return True
        if self.rule is None or step <= 0:
            return False

        def turn(rounds: int, steps: int) -> bool:  # `rounds` spread over `steps`: the next one's turn is here
            return 0 < steps and self.rounds < rounds and step * rounds >= self.rounds * steps

        due = turn(FIRST_ROUNDS, self.rule.expected_steps(steps_s / step)) or turn(MIN_ROUNDS, self.rule.max_steps)
        return due and (self.deadline is None or time.perf_counter() + self.spent_s / self.rounds <= self.deadline)

    def offer(self, steps_s: float, step: int = 0) -> None:
        """After timed step `step` (`steps_s`: the timed steps' seconds so far): one round, if one is due."""
        if not self.due(steps_s, step):
            return
        from ..measure.cachescrub import forward_traffic
        from ..measure.heapfaults import fault_price, replay_priced
        from ..measure.oprates import clock, measure_entries
        from .probethread import ProbeThread

        t0 = time.perf_counter()
        # first, for the count: glibc's heap as the step left it
        if self._logged():
            faults, _, seconds = self.malloc_log.replay(clock(self.device))
            self.replays.append((faults, seconds))
        elif self.sequence is not None:
            self.replays.append(replay_priced(self.sequence, clock(self.device)))
        self._bandwidth()  # before the ops: the copy leaves the caches cold, and the ops' warm-up calls warm them
        if self.probe is None and self.case is not None:
            self.probe = ProbeThread(self.case, forward_traffic(self.entries))
        if self.probe is not None:
            self.probe.step()  # the framework probe's steps and its ops' timings (none once it has failed)
        faults: dict[str, float] = {}
        for key, seconds in measure_entries(self.entries, self.device, trials=1, faults=faults).items():
            self.per_key.setdefault(key, []).append((seconds, faults.get(key, 0.0), self.rounds))
        # last, for the price: the step's freed memory unused as long as the next step finds it
        if self._logged():
            self.repriced.append(self.malloc_log.replay(clock(self.device))[1:])  # its page-sized blocks' faults
        elif self.sequence is not None:
            self.repriced.append(replay_priced(self.sequence, clock(self.device)))
        self.prices.append(fault_price(clock(self.device)))
        self.rounds += 1
        self.spent_s += time.perf_counter() - t0

    def before_step(self) -> None:
        """A timed step begins (its timer not yet running): the first one's mallocs are logged."""
        self._logging = self.malloc_log is not None and not self.malloc_log.events and not self.rounds
        if self._logging:
            self.malloc_log.start()

    def after_step(self) -> None:
        """A timed step has ended (its timer stopped)."""
        if self._logging:
            self.malloc_log.stop()
            self._logging = False

    def _logged(self) -> bool:
        return self.malloc_log is not None and self.malloc_log.events > 0

    def replay_source(self) -> str | None:
        """What the rounds replayed for the step's heap faults (None: nothing)."""
        log = self.malloc_log
        if self._logged():
            dropped = f", {log.dropped:,} beyond the log's capacity left out" if log.dropped else ""
            return f"every malloc and free of the first timed step ({log.events:,} calls{dropped})"
        if self.sequence is not None:
            return (f"the memory step's tensor allocations ({sum(b > 0 for b in self.sequence):,}; "
                    "no malloc log in this worker)")
        return None

    def _bandwidth(self) -> None:
        """The copy bandwidth and the in-place rate (a memory-bound op's floor), as the ops are timed, at this
        round's speed."""
        from ..measure.oprates import copy_once, inplace_once

        if not self._buffers:
            return
        try:
            self.bandwidths.append(copy_once(self._buffers, self.device))
            self.inplace.append(inplace_once(self._buffers[0], self.device))  # the copy's source, read back
        except (RuntimeError, MemoryError):  # a point near its memory cap: the figures measured once stand
            self._buffers = False

    def close(self) -> None:
        """The timed steps are over: let the framework probe's thread end, free the copy's buffers."""
        if self._buffers:
            self._buffers = None
        if self.probe is not None:
            self.probe.close()

    def result(self) -> dict:
        """Each timed entry's median over the rounds (seconds and minor faults per call), how many rounds
        and what they cost, the step's allocations' faults replayed (the median) and what one cost there
        (all rounds' seconds over their faults), the median price of a fault on a fresh mapping, and the
        framework probe's steps (None without them; `probe_error` why it could not step)."""
        self.close()
        probe = self.probe.result() if self.probe is not None else None
        priced = [p for p in self.prices if p is not None]
        fault_s = statistics.median(priced) if priced else None
        heap = [(f, s) for f, s in self.repriced if f > 0]

        def own(seconds: float, faults: float, round_: int) -> float:  # an op's time less its own faults
            price = self.prices[round_] if round_ < len(self.prices) and self.prices[round_] else fault_s
            return max(0.0, seconds - faults * price) if price else seconds

        return {"per_call_s": {k: statistics.median(own(*t) for t in v) for k, v in self.per_key.items()},
                "faults_per_call": {k: statistics.median(t[1] for t in v) for k, v in self.per_key.items()},
                "faults_apart": fault_s is not None,  # the ops' times are without their faults, priced apart
                "heap_faults": statistics.median(f for f, _ in self.replays) if self.replays else None,
                # all rounds' faulting blocks' seconds over their faults: a round with a handful of faults
                # prices them at a block's whole making (tens of µs), weighed here by how few they are
                "heap_fault_s": sum(s for _, s in heap) / sum(f for f, _ in heap) if heap else None,
                "fault_s": fault_s,
                "rounds": self.rounds, "seconds": self.spent_s, "probe": probe,
                "bandwidths": list(self.bandwidths),  # each round's copy bandwidth
                "heap_faults_rounds": [f for f, _ in self.replays],  # each round's first replay's faults
                "heap_replay": self.replay_source(),
                # each round's last replay: what a fault cost there (None: it took none)
                "heap_fault_prices": [s / f if f else None for f, s in self.repriced],
                "figures": {"bandwidth_bytes_per_s": statistics.median(self.bandwidths) if self.bandwidths else None,
                            "inplace_bytes_per_s": statistics.median(self.inplace) if self.inplace else None},
                "probe_error": self.probe.error if self.probe is not None else None}
