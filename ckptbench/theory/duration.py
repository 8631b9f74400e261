"""How long a sweep should take on this machine, projected before any point runs.

A point's time is its overhead (forking a worker, or starting a torchrun group), building the model
(filling every parameter with random numbers), and its training steps: hardware FLOPs per step (the
recomputation included, :mod:`.flops`) over the machine's measured matmul rate times an efficiency.
The rates are measured on the machine (:mod:`ckptbench.measure.rates`); the constants below come from
the committed reference runs and are stated with the projection, which is a projection: each record
keeps its own, so a finished sweep shows how close it came.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ..measure.interval import fewest
from ..spec import Case, ModelSpec
from .flops import hardware_flops_per_token
from .params import param_count

# A training step of the CPU reference run (llama-small, 1 thread, seq 128-1024) ran at 0.30-0.65 of the
# square-matmul rate measured on the same machine with the same threads; 0.4 is its middle.
EFFICIENCY = 0.4
FORK_SERVER_S = 4.0  # importing torch and transformers once (the reference run's first point: 3.99 s)
POINT_S = 0.25  # forking a worker, its probes and result: a tiny model's whole point (smoke run: 0.2-0.3 s)
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


def point_seconds(case: Case, rates: Rates) -> float | None:
    """Projected wall time of one point, or None when the machine has no rate for its device and dtype."""
    rate = rates.matmul.get(rate_key(case))
    if not rate or not case.model.analytic:  # no FLOP formula: not projected rather than guessed
        return None
    steps = case.train.warmup_steps + case.train.memory_steps + timed_steps(case)
    tokens = case.batch_size * case.seq_len * case.grad_accum
    n = case.every_n_layers  # how many layers are checkpointed, counted without listing them (a million points)
    checkpointed = len(case.recompute.layers) or (len(range(0, case.model.layers, n)) if n > 0 else 0)
    compute = steps * _flops_per_token(case.model, case.seq_len, checkpointed, case.recompute.sac) * tokens / (EFFICIENCY * rate)
    build = _params(case.model) / rates.init_elements_per_s if rates.init_elements_per_s else 0.0
    return (GROUP_POINT_S if case.world_size > 1 else POINT_S) + build + compute


def timed_steps(case: Case) -> int:
    """The timed steps a point is projected to run: a multi-rank point its fixed ``steps``; one process
    the fewest that can reach its precision (a 95 % interval needs 6, :func:`~ckptbench.measure.interval.fewest`)
    within its step cap.  A noisy point times more, up to ``max_steps`` or ``max_time_s``."""
    train = case.train
    if case.world_size > 1:
        return train.steps
    return min(max(train.steps, fewest()), max(train.timing.max_steps, train.steps))


@dataclass(frozen=True)
class Projection:
    seconds: float  # the points that could be projected, plus starting the fork server
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
                f"{EFFICIENCY:.0%} of it in training; timed steps at the fewest a precise median needs){rest}")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def project(cases: list[Case], rates: Rates) -> Projection:
    times = [t for t in (point_seconds(c, rates) for c in cases) if t is not None]
    start = FORK_SERVER_S if any(c.world_size == 1 for c in cases) else 0.0
    return Projection(start + sum(times) if times else 0.0, len(times), len(cases) - len(times), rates)
