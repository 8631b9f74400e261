"""How long a sweep should take on this machine, projected before any point runs.

A point's time is its overhead (forking a worker, or starting a torchrun group; on CUDA also the
worker's CUDA context, its model built on the device and its first step's kernel loads), building the
model on a CPU (filling every parameter with random numbers), and its training steps: warm-up, memory
and timed steps, each priced at its hardware FLOPs (the recomputation included, :mod:`.flops`) over the
machine's measured matmul rate times an efficiency.  How many steps are timed follows the point's stop
rule (:mod:`ckptbench.measure.stopping`): on a CPU as many as its caps allow, on CUDA the fewest whose
interval leaves out one outlier on each side (:func:`timed_steps`).  The rates are measured on the
machine (:mod:`ckptbench.measure.rates`); the constants below come from the committed reference runs and
are stated with the projection, which is a projection: each record keeps its own, so a finished sweep
shows how close it came (``docs/suites.md`` sets both reference runs beside it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ...measure.interval import LEVEL, ranks
from ...measure.stopping import StopRule
from ...point.case import Case, ModelSpec
from ..memory.params import param_count
from .flops import hardware_flops_per_token

# A training step ran at 0.23-0.53 of the square-matmul rate measured on the same machine with the same
# threads in the CPU reference run (llama-small fp32, 1 thread, 128-4096 tokens; results/reference-cpu-timed),
# and at 0.09-0.62 (median 0.50; the host-bound 1k-token steps lowest) of the bf16 rate at n = 8192 in the
# H200 run (Llama-1B shape, 1k-32k tokens; results/h200-20261204-gpu-small); 0.4 is the middle of both.
EFFICIENCY = 0.4
FORK_SERVER_S = 4.0  # importing torch and transformers once (the reference run's first point: 3.99 s)
POINT_S = 0.25  # forking a worker, its probes and result: a tiny model's whole point (smoke run: 0.2-0.3 s)
# a CUDA worker beyond its steps: its CUDA context, the model built on the device (module construction and
# first allocations; the parameters are filled there at the device's speed) and its first step's kernel
# loads.  The H200 run: each point's wall time less its timed steps (and less the step-time model's op-rate
# measurement, 30 s over the run, which is not projected) is 1.6 s + 2.2 step times (its warm-up and
# memory steps), a least-squares line over the 42 points; the model builds were 0.36-0.52 s of the 1.6
CUDA_POINT_S = 1.6
# a sweep with CUDA points spends more outside them: the processes that measure the rates here and read
# the machine's speed before the first point and after the last each initialise CUDA.  The H200 run: 18.8
# of its 329.1 s outside its points, 4 of them the fork server's start
CUDA_SWEEP_S = 15.0
GROUP_POINT_S = 8.0  # starting a torchrun group and its process group (localsgd reference: 7-11 s a point)


@dataclass(frozen=True)
class Rates:
    """What the machine measured: matmul FLOP/s per (device, dtype, threads), and parameter init speed."""

    matmul: dict[tuple[str, str, int], float | None] = field(default_factory=dict)
    init_elements_per_s: float | None = None

    @classmethod
    def from_json(cls, data: dict) -> Rates:
        return cls({(d, t, int(n)): r for d, t, n, r in data.get("matmul", [])}, data.get("init_elements_per_s"))


def rate_key(case: Case) -> tuple[str, str, int]:
    return case.device, case.model.dtype, case.train.threads


@functools.lru_cache(maxsize=1 << 16)
def _flops_per_token(spec: ModelSpec, seq: int, checkpointed: int, sac: str) -> float:
    return hardware_flops_per_token(spec, seq, checkpointed, sac=sac)


@functools.lru_cache(maxsize=1 << 10)
def _params(spec: ModelSpec) -> int:
    return param_count(spec).total


def step_seconds(case: Case, rates: Rates) -> float | None:
    """Projected time of one training step of a point (its hardware FLOPs at :data:`EFFICIENCY` of the
    matmul rate measured here), or None without a rate or a FLOP formula."""
    rate = rates.matmul.get(rate_key(case))
    if not rate or not case.model.analytic:  # no FLOP formula: not projected rather than guessed
        return None
    tokens = case.batch_size * case.seq_len * case.grad_accum
    n = case.every_n_layers  # how many layers are checkpointed, counted without listing them (a million points)
    checkpointed = len(case.recompute.layers) or (len(range(0, case.model.layers, n)) if n > 0 else 0)
    return _flops_per_token(case.model, case.seq_len, checkpointed, case.recompute.sac) * tokens / (EFFICIENCY * rate)


def point_seconds(case: Case, rates: Rates) -> float | None:
    """Projected wall time of one point, or None when the machine has no rate for its device and dtype."""
    step = step_seconds(case, rates)
    if step is None:
        return None
    steps = case.train.warmup_steps + case.train.memory_steps + timed_steps(case, step)
    # a CUDA worker builds its model on the device, where filling the parameters is part of CUDA_POINT_S
    cpu_build = case.device != "cuda" and rates.init_elements_per_s
    build = _params(case.model) / rates.init_elements_per_s if cpu_build else 0.0
    overhead = GROUP_POINT_S if case.world_size > 1 else CUDA_POINT_S if case.device == "cuda" else POINT_S
    return overhead + build + steps * step


@functools.lru_cache(maxsize=256)
def _rule(train, device: str) -> StopRule:
    return StopRule.of(train, device)


@functools.lru_cache(maxsize=256)
def steady_steps(rule: StopRule) -> int:
    """The fewest timed steps whose 95 % interval of the median leaves out the fastest and the slowest step
    (the second smallest to the second largest: 9 steps, :func:`~ckptbench.measure.interval.ranks`), at
    the first step the rule reads the times at (every 4th on CUDA: 11), within its step cap: where a
    point whose steps vary by a fraction of its precision, but for one outlier on each side, stops."""
    n = max(rule.min_steps, 1)
    while ranks(n, LEVEL)[0] < 2 or not rule.due(n):
        if n >= rule.max_steps:
            return rule.max_steps
        n += 1
    return n


def timed_steps(case: Case, step_s: float | None = None) -> int:
    """The timed steps a point is projected to run at `step_s` seconds a step.  A multi-rank point: its
    fixed ``steps``.  On CUDA, whose steps are steady, the fewest whose interval leaves out one outlier on
    each side (:func:`steady_steps`: 11; the H200 run's median point timed 11, 33 of its 42 stopped by
    the precision; the 9 that timed 50 had host-bound steps of 0.08-0.14 s).  On a CPU, as many as the caps
    allow (``max_time_s``'s worth, at most ``max_steps``: :meth:`.StopRule.expected_steps`; the CPU
    reference run's points reached a cap at 25 of 30, a shared CPU's steps varying by 2-21 %).  Either
    is at most what the caps allow at `step_s` (the step cap alone without it)."""
    train = case.train
    if case.world_size > 1:
        return train.steps
    rule = _rule(train, case.device)
    cap = rule.expected_steps(step_s) if step_s is not None else rule.max_steps
    return min(cap, steady_steps(rule)) if case.device == "cuda" else cap


def start_seconds(single_process: bool, cuda: bool) -> float:
    """What a sweep spends outside its points: the fork server's start where any point is one process,
    and on a CUDA machine the processes of its own that initialise CUDA (:data:`CUDA_SWEEP_S`)."""
    return (FORK_SERVER_S if single_process else 0.0) + (CUDA_SWEEP_S if cuda else 0.0)


@dataclass(frozen=True)
class Projection:
    seconds: float  # the points that could be projected, plus the sweep's own start (:func:`start_seconds`)
    projected: int  # points with a rate here
    unprojected: int  # points without (a CUDA suite planned on a machine without CUDA)
    rates: Rates

    def text(self) -> str:
        if not self.projected:
            return (f"duration not projected for its {self.unprojected} points: no rate for their device here, "
                    "or no FLOP formula for their model type")
        shown = ", ".join(f"{d} {t} {n} thread{'s' * (n > 1)}: {r / 1e9:.0f} GFLOP/s"
                          for (d, t, n), r in sorted(self.rates.matmul.items()) if r)
        rest = (f"; {self.unprojected} points not projected (no rate for their device here, or no FLOP formula "
                "for their model type)" if self.unprojected else "")
        return (f"projected duration {_minutes(self.seconds)} on this machine (matmul {shown}, at "
                f"{EFFICIENCY:.0%} of it in training; timed steps: a CPU point's up to its caps, a CUDA "
                f"point's the fewest that leave out an outlier each side){rest}")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def project(cases: list[Case], rates: Rates) -> Projection:
    timed = [(c, t) for c, t in ((c, point_seconds(c, rates)) for c in cases) if t is not None]
    start = start_seconds(any(c.world_size == 1 for c, _ in timed), any(c.device == "cuda" for c, _ in timed))
    return Projection(start + sum(t for _, t in timed) if timed else 0.0, len(timed), len(cases) - len(timed),
                      rates)
