"""The α–β projection: the ring all-reduce formula by hand, and the crossover K it implies."""

import math

import pytest

from ckptbench.measure.bus import bus_bytes
from ckptbench.theory.comm.network import (
    LINKS,
    Link,
    allreduce_s,
    comm_s,
    crossover_k,
    project_step,
    sync_s,
)

LINK = Link("test", bandwidth_Bps=1e9, latency_s=1e-5, note="1 GB/s, 10 µs")


def test_ring_allreduce_by_hand():
    # 4 ranks, 1 MB: 2·3 latency steps, and each rank sends 2·3/4 of the buffer
    assert allreduce_s(1e6, 4, LINK) == pytest.approx(6 * 1e-5 + 1.5e6 / 1e9)
    assert allreduce_s(1e6, 1, LINK) == 0.0


def test_comm_from_bus_bytes_equals_the_formula_per_allreduce():
    # the probe records bus bytes = payload × 2(n−1)/n, so both routes agree
    payload, n = 723_200, 2
    assert comm_s(3, 3 * bus_bytes("allreduce", payload, n), n, LINK) == pytest.approx(3 * allreduce_s(payload, n, LINK))


def test_projected_step_adds_communication_or_hides_it():
    p = project_step(0.010, 1, 2e6, 2, LINK)
    assert p.comm_s == pytest.approx(2e-5 + 2e-3)
    assert p.step_s == pytest.approx(0.010 + p.comm_s)
    assert p.overlapped_s == 0.010


def test_crossover_is_the_first_k_where_averaging_costs_a_tenth_of_compute():
    t_sync = sync_s(1e8, 10, 2, LINK)  # 100 MB of parameters, 10 tensors
    assert t_sync == pytest.approx(10 * 2e-5 + 0.1)
    k = crossover_k(1e8, 10, 2, compute_s=0.05, link=LINK)
    assert k == math.ceil(t_sync / 0.005)
    assert t_sync / k <= 0.005 < t_sync / (k - 1)
    assert crossover_k(1.0, 1, 2, compute_s=10.0, link=LINK) == 1


def test_faster_links_need_smaller_k():
    ks = [crossover_k(7.2e5, 39, 2, 0.03, link) for link in LINKS]  # llama-tiny, accelerate's per-tensor sync
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]
    names = [link.name for link in LINKS]
    assert names == ["1 GbE", "10 GbE", "100 GbE", "100G IB", "200G IB", "PCIe 4", "400G IB", "PCIe 5", "NVLink3",
                     "NVLink"]
