"""Step time on a network we did not run on: an α–β projection from measured payloads and compute time.

A projection, never a measurement, and every figure built from here says so.  The model is the
textbook one for a bandwidth-optimal ring all-reduce of B bytes over n ranks (Thakur, Rabenseifner &
Gropp 2005; Patarasuk & Yuan 2009): 2(n−1) steps, each paying the link's latency α and moving B/n
bytes at bandwidth β::

    T(B, n) = 2(n−1)·α + 2(n−1)/n · B / β

``2(n−1)/n · B`` is exactly the *bus bytes* the collective probe records (:mod:`ckptbench.measure.bus`),
so a projected step is ``compute + collectives × 2(n−1)·α + bus bytes / β`` with every input observed:
the collectives and bus bytes per optimizer step the run counted, and its compute time per step (step
time less synchronisation).  Communication is added to compute, not overlapped: right for local SGD,
whose averaging blocks the loop; for DDP, whose bucket all-reduces overlap the backward, the real time
lies between ``max(compute, comm)`` (``overlapped_s``) and the sum (the plan's :mod:`.overlap` models
where in between).  Links are taken at their nominal rate times an assumed efficiency (:class:`Link`); not
modelled: congestion, hierarchical (intra-/inter-node) algorithms beyond the slowest link of the ring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Communication may cost this share of the compute time before it is said to matter (the crossover K).
NEGLIGIBLE = 0.10


@dataclass(frozen=True)
class Link:
    """A named interconnect: nominal bandwidth per direction and per GPU (bytes/s), per-message latency α
    (s), and the share of the nominal rate a large collective's bus bandwidth reaches on it."""

    name: str
    bandwidth_Bps: float
    latency_s: float
    note: str
    efficiency: float = 1.0
    between_hosts: bool = False  # a network between hosts (one NIC per GPU), else a link inside one

    @property
    def bus_Bps(self) -> float:
        """The bus bandwidth a large collective reaches (nccl-tests' busbw): nominal × efficiency."""
        return self.bandwidth_Bps * self.efficiency


# Nominal line rates per GPU.  α is a typical small-message latency through the stack a collective library
# uses on that link (TCP for Ethernet up to 10 GbE, RDMA beyond); the efficiencies are assumptions of
# this tool (a large message's bus bandwidth over the nominal rate), stated in every plan that uses them
# and replaced by a measured rate where ``ckptbench calibrate --collective`` gave one.
LINKS: tuple[Link, ...] = (  # slowest bus bandwidth first
    Link("1 GbE", 1e9 / 8, 50e-6, "1 Gbit/s Ethernet, TCP: α = 50 µs, 90 % of line rate (assumed)", 0.9, True),
    Link("10 GbE", 10e9 / 8, 25e-6, "10 Gbit/s Ethernet, TCP: α = 25 µs, 90 % of line rate (assumed)", 0.9, True),
    Link("100 GbE", 100e9 / 8, 10e-6, "100 Gbit/s Ethernet (RoCE) per GPU: α = 10 µs, 85 % of line rate "
         "(assumed)", 0.85, True),
    Link("100G IB", 100e9 / 8, 5e-6, "100 Gbit/s InfiniBand (EDR) per GPU: α = 5 µs, 90 % of line rate (assumed)",
         0.9, True),
    Link("200G IB", 200e9 / 8, 5e-6, "200 Gbit/s InfiniBand (HDR) per GPU: α = 5 µs, 90 % of line rate (assumed)",
         0.9, True),
    Link("PCIe 4", 32e9, 5e-6, "PCIe 4.0 x16 between GPUs of one host, 32 GB/s per direction: α = 5 µs, 75 % "
         "(assumed)", 0.75),
    Link("400G IB", 400e9 / 8, 5e-6, "400 Gbit/s InfiniBand (NDR) per GPU: α = 5 µs, 90 % of line rate (assumed)",
         0.9, True),
    Link("PCIe 5", 64e9, 5e-6, "PCIe 5.0 x16 between GPUs of one host, 64 GB/s per direction: α = 5 µs, 75 % "
         "(assumed)", 0.75),
    Link("NVLink3", 300e9, 3e-6, "NVLink 3 (A100 class), 300 GB/s per direction: α = 3 µs, 80 % (assumed)", 0.8),
    Link("NVLink", 450e9, 3e-6, "NVLink 4 (H100 class), 450 GB/s per direction: α = 3 µs, 80 % (assumed)", 0.8),
)


def link_named(name: str) -> Link:
    return next(k for k in LINKS if k.name == name)


def measured_link(base: Link, bus_Bps: float, latency_s: float | None, source: str) -> Link:
    """`base` with the bus bandwidth (and latency, where measured) a calibration measured."""
    return Link(base.name, bus_Bps, latency_s if latency_s is not None else base.latency_s,
                f"{base.name}: measured {bus_Bps / 1e9:.3g} GB/s bus bandwidth ({source})", 1.0, base.between_hosts)


def allreduce_s(payload_bytes: float, world: int, link: Link) -> float:
    """Ring all-reduce of `payload_bytes` over `world` ranks on `link`: 2(n−1)α + 2(n−1)/n · B/β."""
    if world < 2:
        return 0.0
    return 2 * (world - 1) * link.latency_s + 2 * (world - 1) / world * payload_bytes / link.bus_Bps


def allgather_s(shard_bytes: float, world: int, link: Link) -> float:
    """Ring all-gather of a `shard_bytes` shard from each of `world` ranks: (n−1)α + (n−1) · shard/β."""
    if world < 2:
        return 0.0
    return (world - 1) * link.latency_s + (world - 1) * shard_bytes / link.bus_Bps


def reduce_scatter_s(input_bytes: float, world: int, link: Link) -> float:
    """Ring reduce-scatter of an `input_bytes` buffer (each rank keeps 1/n): (n−1)α + (n−1)/n · B/β."""
    if world < 2:
        return 0.0
    return (world - 1) * link.latency_s + (world - 1) / world * input_bytes / link.bus_Bps


def comm_s(collectives: float, bus_bytes: float, world: int, link: Link) -> float:
    """`collectives` all-reduces carrying `bus_bytes` in all (already × 2(n−1)/n): latency plus bandwidth."""
    if world < 2:
        return 0.0
    return collectives * 2 * (world - 1) * link.latency_s + bus_bytes / link.bus_Bps


@dataclass(frozen=True)
class StepProjection:
    link: str
    compute_s: float
    comm_s: float

    @property
    def step_s(self) -> float:
        """Compute then communication, as a blocking averaging runs."""
        return self.compute_s + self.comm_s

    @property
    def overlapped_s(self) -> float:
        """The best case when communication hides under compute (DDP's buckets during backward)."""
        return max(self.compute_s, self.comm_s)


def project_step(compute_s: float, collectives_per_step: float, bus_bytes_per_step: float, world: int,
                 link: Link) -> StepProjection:
    """One optimizer step on `link`, from what one measured step computed and communicated."""
    return StepProjection(link.name, compute_s, comm_s(collectives_per_step, bus_bytes_per_step, world, link))


def sync_s(param_bytes: float, collectives_per_sync: float, world: int, link: Link) -> float:
    """One parameter averaging: `collectives_per_sync` all-reduces (one per tensor for accelerate's
    LocalSGD, one flattened for torch's averager) moving the parameters once."""
    return comm_s(collectives_per_sync, 2 * (world - 1) / world * param_bytes, world, link)


def crossover_k(param_bytes: float, collectives_per_sync: float, world: int, compute_s: float, link: Link,
                negligible: float = NEGLIGIBLE) -> int:
    """The smallest K at which averaging every K steps costs at most `negligible` of the compute:
    ``ceil(T_sync / (negligible × compute))``; 1 when even averaging every step is that cheap."""
    if compute_s <= 0:
        raise ValueError("compute time per step must be positive")
    return max(1, math.ceil(sync_s(param_bytes, collectives_per_sync, world, link) / (negligible * compute_s)))
