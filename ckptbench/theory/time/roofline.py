"""A step's roofline: the traced step's operators at a card's datasheet rates, for a card that is not here.

Where the card is not in the room, nothing can be measured on it, so the step is priced op by op: the
step's op trace (traced on fake tensors by :mod:`.optrace`: forward, backward with the recomputation of
checkpointed layers as torch runs it, the optimizer step and, for offload, the host↔device copies),
grouped into distinct (op, shapes, dtypes) entries with their counts.  Each entry costs the longer of its
FLOPs at the card's peak FLOP/s (a matmul or attention kernel) and the bytes it spans at the card's memory
bandwidth, and at least a kernel launch; a copy between host and device its bytes over the link.  No
kernel reaches its datasheet rate, so the figure is a lower bound, labelled as such wherever it is shown
(the stated error of docs/step-time-model.md).  A card that *is* here is measured instead
(:mod:`.steptime`).  Pure: no torch import.
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
    """What an entry costs on one card: the rates that model it."""

    device: str  # cpu | cuda
    source: str  # "datasheet <card> <dtype>"
    matmul_flops_per_s: float | None = None
    bandwidth_bytes_per_s: float | None = None  # a copy's, source plus destination bytes over its time
    link_bytes_per_s: float | None = None  # host<->device
    launch_s: float = 0.0  # the floor of a kernel (CUDA)
    notes: dict = field(default_factory=dict)  # figure -> where it comes from


@dataclass
class StepCost:
    seconds: float
    ops: int
    distinct: int
    by_kind: dict
    by_phase: dict
    source: str

    def to_dict(self) -> dict:
        return asdict(self)


def entry_seconds(entry: dict, rates: Rates) -> float:
    """Seconds per call of a traced entry at the card's rates (a view moves nothing and launches nothing)."""
    kind = entry["kind"]
    if kind == "view":
        return 0.0
    if kind == "copy":
        if rates.device != "cuda":
            return 0.0  # a host tensor "copied" to the host is the tensor itself
        return entry["bytes"] / (rates.link_bytes_per_s or HOST_LINK_BYTES_PER_S)
    seconds = 0.0
    if kind in ("matmul", "attention") and rates.matmul_flops_per_s:
        seconds = entry["flops"] / rates.matmul_flops_per_s
    if rates.bandwidth_bytes_per_s:
        seconds = max(seconds, entry["bytes"] / rates.bandwidth_bytes_per_s)
    return max(seconds, rates.launch_s)


def step_cost(entries: list[dict], rates: Rates) -> StepCost:
    """The step's roofline seconds: every entry's calls at its price."""
    total = 0.0
    ops = 0
    by_kind: dict[str, float] = {}
    by_phase: dict[str, float] = {}
    for e in entries:
        per = entry_seconds(e, rates)
        for phase, n in e["counts"].items():
            if not n:
                continue
            ops += n if e["kind"] != "copy" else 0
            by_phase[phase] = by_phase.get(phase, 0.0) + n * per
            by_kind[e["kind"]] = by_kind.get(e["kind"], 0.0) + n * per
            total += n * per
    return StepCost(total, ops, len(entries), by_kind, by_phase, rates.source)


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
    source = (f"roofline: datasheet rates of the {device_name} ({dtype} peak FLOP/s, memory bandwidth; no kernel "
              "reaches them, so the step times are a lower bound)" if peak == datasheet else
              f"roofline: the {device_name}'s calibrated matmul rate and its datasheet memory bandwidth")
    return Rates("cuda", source, matmul_flops_per_s=peak, bandwidth_bytes_per_s=bandwidth,
                 link_bytes_per_s=link_bytes_per_s or HOST_LINK_BYTES_PER_S, launch_s=LAUNCH_S,
                 notes={"launch_s": "assumed 4 us a kernel"})
