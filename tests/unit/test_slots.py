"""Slots: which cores or GPUs each point gets when points run side by side (no GPU needed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ckptbench.base.errors import UsageError
from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run.lifeline import CORES_VAR
from ckptbench.run.slots import Slot, core_list, cpu_slots, cuda_slots, place, sweep_slots


def case(world_size: int = 1, device: str = "cpu", threads: int = 1) -> Case:
    return Case(model=preset("llama-tiny"), train=TrainSpec(threads=threads), batch_size=1, seq_len=8,
                world_size=world_size, device=device)


def test_cpu_slots_cut_the_allowed_cores_in_order_by_threads():
    assert cpu_slots(2, 1, [0, 1]) == (Slot(0, (0,)), Slot(1, (1,)))
    assert cpu_slots(2, 2, [4, 5, 6, 7, 8]) == (Slot(0, (4, 5)), Slot(1, (6, 7)))


def test_more_cores_than_allowed_is_a_usage_error_naming_both():
    with pytest.raises(UsageError, match=r"--parallel 3 with 1 thread per point needs 3 cores; this process may "
                                         r"use 2 \(0-1\)"):
        cpu_slots(3, 1, [0, 1])
    with pytest.raises(UsageError, match="needs 4 cores"):
        sweep_slots([case(threads=2)], parallel=2, devices=None, available=[0, 1, 2])


def test_cuda_slots_name_the_physical_device_behind_each_visible_index():
    assert [s.device for s in cuda_slots([0, 1], None)] == ["0", "1"]
    # inside a Slurm job that was given GPUs 2 and 3, index 1 is GPU 3
    assert [s.device for s in cuda_slots([1, 0], "2,3")] == ["3", "2"]
    assert [s.device for s in cuda_slots([0], "GPU-aaaa,GPU-bbbb")] == ["GPU-aaaa"]
    with pytest.raises(UsageError, match="this process sees 2 CUDA devices"):
        cuda_slots([2], "2,3")
    with pytest.raises(UsageError, match="twice"):
        cuda_slots([0, 0], None)


def test_each_flag_belongs_to_its_device():
    with pytest.raises(UsageError, match="--devices is for CUDA suites"):
        sweep_slots([case()], parallel=None, devices=(0, 1))
    with pytest.raises(UsageError, match="--devices 0,1"):
        sweep_slots([case(device="cuda")], parallel=2, devices=None)
    with pytest.raises(UsageError, match="give one of them"):
        sweep_slots([case()], parallel=2, devices=(0,))
    with pytest.raises(UsageError, match="world size 4 needs 4 devices; --devices gives 2"):
        sweep_slots([case(device="cuda"), case(world_size=4, device="cuda")], parallel=None, devices=(0, 1))


def test_without_flags_one_slot_pins_nothing():
    slots = sweep_slots([case(), case(world_size=2)], parallel=None, devices=None)
    assert slots == (Slot(0),)
    placement = place(case(world_size=2), slots, {0})
    assert placement.cores == () and placement.env() == {} and placement.label() == "unpinned"


def test_a_multi_rank_point_takes_a_slot_per_rank_and_waits_for_them():
    slots = cpu_slots(4, 1, [0, 1, 2, 3])
    assert place(case(world_size=2), slots, {1, 3}).cores == (1, 3)
    assert place(case(world_size=2), slots, {2}) is None  # waits until a second slot is free
    # on CPU a group wider than the machine gets every slot, as a serial sweep gives it the machine
    assert place(case(world_size=8), slots, {0, 1, 2, 3}).slots == (0, 1, 2, 3)
    assert place(case(world_size=8), slots, {0, 1, 2}) is None


def test_cuda_placement_sets_visible_devices_for_every_rank():
    slots = cuda_slots([0, 1, 2, 3], "4,5,6,7")
    one = place(case(device="cuda"), slots, {2, 3})
    assert one.env() == {"CUDA_VISIBLE_DEVICES": "6"} and one.label() == "cuda 6"
    group = place(case(world_size=2, device="cuda"), slots, {0, 2, 3})
    assert group.env() == {"CUDA_VISIBLE_DEVICES": "4,6"}
    assert group.to_dict() == {"slots": [1, 3], "of": 4, "cores": [], "cuda_visible_devices": "4,6"}


def test_core_list_uses_range_notation():
    assert core_list([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert core_list([5]) == "5"



@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to see a pin")
def test_a_torchrun_group_is_pinned_through_the_lifeline():
    """The sweep starts torchrun through run.lifeline; with a slot's cores in CKPTBENCH_CORES, what it
    launches (and every rank torchrun forks) has exactly those cores."""
    core = max(os.sched_getaffinity(0))
    proc = subprocess.run([sys.executable, "-m", "ckptbench.run.lifeline", sys.executable, "-c",
                           "import os; print(sorted(os.sched_getaffinity(0)))"],
                          env={**os.environ, CORES_VAR: str(core)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"[{core}]"
