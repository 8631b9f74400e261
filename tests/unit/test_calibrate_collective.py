"""``calibrate --collective``: a ring all-reduce timed between processes here, and the plan that uses it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True, text=True, timeout=timeout)


def test_a_measured_all_reduce_replaces_the_named_links_rate(tmp_path):
    proc = _cli("calibrate", str(tmp_path), "--collective", "2", "--size-mib", "4", "--reps", "3")
    assert proc.returncode == 0, proc.stderr
    cal = json.loads((tmp_path / "calibration.json").read_text())
    assert cal["collective_backend"] == "gloo" and cal["collective_world"] == 2
    assert cal["collective_payload_bytes"] == 4 * 2**20 and cal["collective_bus_bytes_per_s"] > 0
    # timings of a shared machine: their order is not asserted (CI once timed the large payload faster)
    assert cal["collective_latency_s"] > 0 and cal["collective_large_s"] > 0 and cal["collective_small_s"] > 0
    proc = _cli("plan", "--model", "llama-tiny", "--device", "h100", "--seq", "64", "--precision", "bf16",
                "--world", "2", "--calibration", str(tmp_path / "calibration.json"), "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    link = plan["assumptions"]["measured_link"]
    assert link["bandwidth_Bps"] == cal["collective_bus_bytes_per_s"] and link["efficiency"] == 1.0
    assert link["latency_s"] == cal["collective_latency_s"]
    assert "(measured)" in plan["assumptions"]["sources"]["network"]


@pytest.mark.parametrize("value", ["1", "0"])
def test_a_collective_of_fewer_than_two_processes_is_refused(tmp_path, value):
    proc = _cli("calibrate", str(tmp_path), "--collective", value)
    assert proc.returncode == 2 and "--collective" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "calibration.json").exists()
