"""A step's time, priced op by op: the traced step's operators at the rates this device was measured at.

The step's op trace (:mod:`ckptbench.measure.optrace`: recorded on the real step, or on fake tensors by
:mod:`.optrace`) holds every aten op it dispatches, forward, backward
(the recomputation of checkpointed layers included, as torch runs it, early stop and all), the optimizer
step and, for an offloaded CUDA step, the host↔device copies, grouped into distinct (op, shapes, dtypes)
entries with their counts.  Each entry is priced by a :class:`Rates` table:

- an entry the device timed (:mod:`ckptbench.measure.oprates`: the op replayed on tensors of the same
  layout, median of a few trials) costs what it was timed at; a memory-bound one (element-wise, reduction,
  copy) at least what its traffic beyond the caches takes: timed back to back its tensors sit in the
  cache, in the step they were written long before and come from memory.  That floor has two measured
  parts: every byte it spans at the rate an in-place op reads and writes back a buffer beyond the caches,
  and every byte it writes fresh (an output sharing no storage with an input) once more, at what a copy
  pays beyond that for its destination (a write-allocate cache reads a line before it is written).  Where
  the in-place rate was not measured, the bytes it spans over the copy bandwidth;
- a view (an op that returns an alias and moves nothing) costs the dispatcher's own per-call time on a
  CPU; on a GPU it launches no kernel, and its host time is the framework's;
- an entry nobody timed is modelled: FLOPs over the matmul rate for a matmul or attention kernel, bytes
  it spans over the memory bandwidth otherwise, host↔device copies over the link, and never less than
  a kernel launch on a GPU;

on a CPU the step also pays for the page faults its allocations take beyond those its ops' timings
already took (:mod:`ckptbench.measure.heapfaults`: the step's allocations replayed, each fault at its
measured price), and every op pays the framework's time per op (Python, autograd's graph and engine, module
hooks, checkpoint's bookkeeping: what a step spends beside its kernels, measured on the same
architecture shrunk until its kernels cost nothing, and between a point's steps with the point's traffic
read between its modules: :mod:`ckptbench.measure.cachescrub`).  A GPU runs asynchronously: there the step
takes the longer of the host's time and the kernels' (:attr:`Rates.host_bound`).

Without the device (planning a GPU from a CPU), :func:`datasheet_rates` prices every entry from the
card's datasheet peak FLOP/s and memory bandwidth: an optimistic figure (no kernel reaches its
datasheet rate), labelled as such wherever it is shown.  Pure: no torch import.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .flops import peak_flops

# HBM bandwidth by device-name substring, bytes/s (vendors' datasheets; first match wins, as PEAK_FLOPS)
DATASHEET_BANDWIDTH: tuple[tuple[str, float], ...] = (
    ("H200 NVL", 4.8e12),
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),
    ("A100-SXM4-40GB", 1.555e12),
    ("A100", 2.039e12),
    ("L40S", 864e9),
    ("RTX 4090", 1008e9),
)
LAUNCH_S = 4e-6  # a CUDA kernel's launch, the floor of any kernel's time (an assumption, not a datasheet figure)
HOST_LINK_BYTES_PER_S = 20e9  # pinned host<->device copies, each way, until measured


@dataclass
class Rates:
    """What an entry costs on one device: timed entries by key, and the rates that model the rest."""

    device: str  # cpu | cuda
    source: str  # "measured here at <time>" | "datasheet <card> <dtype>"
    per_call_s: dict = field(default_factory=dict)  # entry key -> seconds per call, timed on the device
    dispatch_s: float = 0.0  # a view's cost: the dispatcher serving an alias
    framework_s_per_op: float = 0.0  # host time per dispatched op beside the kernels (CPU)
    matmul_flops_per_s: float | None = None
    bandwidth_bytes_per_s: float | None = None  # a copy's, source plus destination bytes over its time
    inplace_bytes_per_s: float | None = None  # an in-place op's, its bytes read plus written back
    link_bytes_per_s: float | None = None  # host<->device, for copies nobody timed
    fault_s: float = 0.0  # a minor page fault (CPU), measured
    launch_s: float = 0.0  # the floor of a modelled kernel (CUDA)
    # CUDA: the host runs ahead of the kernels, so the step is the longer of the two, not their sum
    host_bound: bool = False
    notes: dict = field(default_factory=dict)  # figure -> where it comes from


@dataclass
class StepCost:
    seconds: float
    kernel_s: float
    framework_s: float
    ops: int
    distinct: int
    modelled: int  # entries priced from FLOPs or bytes, not timed
    by_kind: dict
    by_phase: dict
    source: str
    heap_faults: float = 0.0  # page faults priced beside the ops (see step_cost)
    fault_s: float = 0.0  # their seconds, in `seconds`

    def to_dict(self) -> dict:
        return asdict(self)


def entry_seconds(entry: dict, rates: Rates) -> tuple[float, bool]:
    """(seconds per call of the entry, whether it was modelled rather than timed)."""
    kind = entry["kind"]
    if kind == "view":  # host time alone: on a GPU the framework's, beside the kernels
        return (0.0 if rates.host_bound else rates.dispatch_s), False
    timed = rates.per_call_s.get(entry["key"])
    if timed is not None:
        if kind == "memory" and rates.bandwidth_bytes_per_s:
            # timed back to back its tensors sit in the cache; in the step they were written long before
            return max(timed, memory_floor(entry, rates)), False
        return timed, False
    if kind == "copy":
        if rates.device != "cuda":
            return 0.0, False  # a host tensor "copied" to the host is the tensor itself
        link = rates.link_bytes_per_s or HOST_LINK_BYTES_PER_S
        return entry["bytes"] / link, True
    seconds = 0.0
    if kind in ("matmul", "attention") and rates.matmul_flops_per_s:
        seconds = entry["flops"] / rates.matmul_flops_per_s
    if rates.bandwidth_bytes_per_s:
        seconds = max(seconds, memory_floor(entry, rates))
    return max(seconds, rates.launch_s) + rates.dispatch_s, True


def memory_floor(entry: dict, rates: Rates) -> float:
    """The least a memory-bound entry takes with its tensors beyond the caches (see the module's text): its
    bytes at the in-place rate, plus its fresh bytes at the copy's write-allocate price (a copy of n bytes,
    2n spanned and n fresh, takes 2n over the copy bandwidth: each fresh byte costs 2/copy - 2/in-place);
    its bytes over the copy bandwidth where the in-place rate or the fresh bytes are not known."""
    copy, inplace, fresh = rates.bandwidth_bytes_per_s, rates.inplace_bytes_per_s, entry.get("fresh_bytes")
    if not inplace or fresh is None:
        return entry["bytes"] / copy
    return entry["bytes"] / inplace + fresh * max(0.0, 2 / copy - 2 / inplace)


def step_cost(entries: list[dict], rates: Rates, heap_faults: float = 0.0) -> StepCost:
    """The step's predicted seconds: every entry's calls at its price, plus the framework's time per op,
    plus `heap_faults` (page faults the step takes beyond its ops' timings, on a CPU) at the fault's price."""
    kernel = 0.0
    ops = modelled = 0
    by_kind: dict[str, float] = {}
    by_phase: dict[str, float] = {}
    for e in entries:
        per, guessed = entry_seconds(e, rates)
        modelled += guessed
        for phase, n in e["counts"].items():
            if not n:
                continue
            ops += n if e["kind"] != "copy" else 0
            seconds = n * per + (n * rates.framework_s_per_op if e["kind"] != "copy" else 0.0)
            by_phase[phase] = by_phase.get(phase, 0.0) + seconds
            by_kind[e["kind"]] = by_kind.get(e["kind"], 0.0) + n * per
            kernel += n * per
    framework = ops * rates.framework_s_per_op
    faults = 0.0 if rates.host_bound else heap_faults * rates.fault_s  # a GPU's host faults beside its kernels
    seconds = max(kernel, framework) if rates.host_bound else kernel + framework + faults
    return StepCost(seconds, kernel, framework, ops, len(entries), modelled, by_kind, by_phase, rates.source,
                    heap_faults, faults)


def datasheet_bandwidth(device_name: str | None) -> float | None:
    for key, bandwidth in DATASHEET_BANDWIDTH:
        if device_name and key.lower() in device_name.lower():
            return bandwidth
    return None


def datasheet_rates(device_name: str | None, dtype: str, link_bytes_per_s: float | None = None,
                    matmul_flops_per_s: float | None = None) -> Rates | None:
    """Rates from the card's datasheet (peak FLOP/s in the compute dtype, memory bandwidth), or None when
    the card is not in the tables.  A measured matmul rate (``ckptbench calibrate`` on that card) replaces
    the peak where given."""
    datasheet = (peak_flops(device_name, dtype) or (None,))[0]
    peak = matmul_flops_per_s or datasheet
    bandwidth = datasheet_bandwidth(device_name)
    if not peak or not bandwidth:
        return None
    source = (f"datasheet rates of the {device_name} ({dtype} peak FLOP/s, memory bandwidth; no kernel reaches "
              "them, so the step times are a lower bound)" if peak == datasheet else
              f"the {device_name}'s calibrated matmul rate and its datasheet memory bandwidth")
    return Rates("cuda", source, matmul_flops_per_s=peak, bandwidth_bytes_per_s=bandwidth,
                 link_bytes_per_s=link_bytes_per_s or HOST_LINK_BYTES_PER_S, launch_s=LAUNCH_S,
                 notes={"launch_s": "assumed 4 us a kernel"})
