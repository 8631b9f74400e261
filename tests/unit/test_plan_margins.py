"""A CUDA plan's margins: stated defaults until a GPU run's records measure them, the worst point kept."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptbench.spec import Case, TrainSpec, preset
from ckptbench.store.records import RecordStore
from ckptbench.theory.plan import CUDA_CONTEXT_BYTES, CUDA_RESERVED_MARGIN, measured_margins

GIB = 2**30


def _record(case_id: str, allocated: int, reserved: int, context: int | None, status: str = "ok",
            device: str = "cuda") -> dict:
    """A record carrying the figures a CUDA memory step writes (the input this rule reads)."""
    return {"case_id": case_id, "status": status, "strategy": "full",
            "case": Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8, device=device).to_dict(),
            "measurement": {"cuda_max_allocated_bytes": allocated, "cuda_max_reserved_bytes": reserved},
            "meters": {"cuda_context_bytes": context}}


def test_the_worst_measured_point_replaces_the_defaults():
    records = [_record("a", 10 * GIB, 11 * GIB, 500 * 2**20), _record("b", 20 * GIB, 21 * GIB, 520 * 2**20),
               _record("c", 5 * GIB, 9 * GIB, None, status="oom"),  # a failed point says nothing
               _record("d", 5 * GIB, 9 * GIB, None, device="cpu")]
    margin, context, used = measured_margins(records)
    assert margin == pytest.approx(0.1) and context == 520 * 2**20 and used == 2
    assert measured_margins([]) == (None, None, 0)


@pytest.mark.slow
def test_plan_from_a_run_says_the_margins_were_measured(tmp_path):
    store = RecordStore(str(tmp_path / "gpu"))
    store.ensure()
    store.append(_record("a", 10 * GIB, 10 * GIB + GIB // 2, 700 * 2**20))  # reserved 5 % over allocated
    cmd = [sys.executable, "-m", "ckptbench", "plan", "--model", "llama-1b", "--device", "h100", "--seq", "4096",
           "--dtype", "bf16", "--attn", "sdpa"]
    default = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    measured = subprocess.run([*cmd, "--from-run", str(tmp_path / "gpu")], capture_output=True, text=True,
                              timeout=120)
    assert default.returncode == measured.returncode == 0, measured.stderr
    assumed = next(line for line in measured.stdout.splitlines() if line.startswith("assumed: "))
    assert "reserved +5% and context 700 MiB on the peak (measured in" in assumed
    assert f"reserved +{CUDA_RESERVED_MARGIN:.0%} and context {CUDA_CONTEXT_BYTES // 2**20} MiB on the peak (default)" \
        in default.stdout
    empty = RecordStore(str(tmp_path / "cpu"))
    empty.ensure()
    empty.append(_record("b", GIB, GIB, None, device="cpu"))
    refused = subprocess.run([*cmd, "--from-run", str(tmp_path / "cpu")], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "no ok CUDA record" in refused.stderr
