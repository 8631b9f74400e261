"""scripts/gpu_check.sh without a sweep: the suites it runs on a GPU hold what docs/gpu.md says, and its
time boxes hold (a part without the time it needs is skipped, one that fails does not stop the next, each
is in the table of parts).  The script end to end on CPU: tests/e2e/test_gpu_path.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from ckptbench.suite.parse import load_suite

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _suite(name: str):
    return load_suite(os.path.join(REPO, "suites", f"{name}.toml"))


def test_the_checks_suites_hold_what_the_check_runs():
    main = _suite("gpu-check")
    assert len(main.cases) == 15 and {c.device for c in main.cases} == {"cuda"}
    assert {c.strategy for c in main.cases} == {"none", "every-2", "every-2+offload", "full", "full+offload"}
    assert [c.seq_len for c in main.cases[::5]] == [8192, 1024, 4096]  # the two ends first
    small = {c.id for c in _suite("gpu-small").cases}
    assert {c.id for c in main.cases} <= small  # the reference simulated.jsonl covers every point

    extras = _suite("gpu-extras").cases
    names = [c.strategy for c in extras]
    assert {"full+offload-streamed", "full+offload", "compile-budget-0.5", "compile-budget-1",
            "none+lora16", "full+offload-streamed+lora16"} <= set(names)
    assert names[-2:] == ["compile-budget-0.5", "compile-budget-1"]  # the slowest last
    assert all(c.setup.lora is None or (c.setup.lora.r == 16 and not c.setup.lora.quantize) for c in extras)
    assert {c.device for c in extras} == {"cuda"}

    for name in ("gpu-check-cpu", "gpu-extras-cpu"):  # the stand-ins when ALLOW_CPU=1 finds no CUDA
        assert {c.device for c in _suite(name).cases} == {"cpu"}
    assert any("offload-streamed" in c.strategy for c in _suite("gpu-extras-cpu").cases)


@pytest.mark.skipif(torch.cuda.is_available(), reason="leans on ALLOW_CPU's stand-ins: this machine has CUDA")
def test_parts_without_time_are_skipped_and_a_failed_part_does_not_stop_the_next(tmp_path):
    env = {**os.environ, "ALLOW_CPU": "1", "PYTHON": sys.executable, "BUDGET_S": "100", "FINAL_S": "45",
           "PARTS": "sweep,extras,plan", "SWEEP_BOX_S": "5", "PLAN_BOX_S": "5",
           "EXTRAS_SUITE": str(tmp_path / "missing.toml")}
    out = tmp_path / "out"
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu_check.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout.split("] parts\n", 1)[1]
    rows = {m.group(1): m.group(2).strip() for m in re.finditer(r"^(\S+) +(.+?) +\S+s +\S+$", table, re.M)}
    assert rows["sweep"] == "skipped (no time)"
    assert rows["step-time"] == "skipped (no records)"
    assert rows["extras"] == "failed (exit 2)"  # a suite that is not there: the sweep's usage error
    assert rows["plan"] == "skipped (no time)"
    assert rows["gpu-tests"] == "not asked (PARTS)"
    assert rows["final"] == "done"
    assert "gpu-check done in" in proc.stdout
    assert (out / "gpu_check.log").read_text() == proc.stdout
    assert not (out / "run" / "records.jsonl").exists()
