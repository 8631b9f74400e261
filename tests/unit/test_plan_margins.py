"""A CUDA plan's margins: stated defaults until a GPU run's records measure them, the worst point kept."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.store.records import RecordStore
from ckptbench.theory.memory.margins import measured_margins
from ckptbench.theory.policy.plan import CUDA_CONTEXT_BYTES, CUDA_RESERVED_MARGIN

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
    margin, context, used, rejected = measured_margins(records)
    assert margin == pytest.approx(0.1) and context == 520 * 2**20 and used == 2 and rejected == 0
    assert measured_margins([]) == (None, None, 0, 0)


def test_figures_no_card_measured_are_left_out_and_counted():
    """A run's folder may hold anything: a reserve below the allocation (-1 GB had Llama-8B fit an H100 at
    batch 65,536), a context of 1e30 bytes, text (TypeError), 1e300 (OverflowError)."""
    good = _record("g", 10 * GIB, 11 * GIB, 500 * 2**20)
    bad = [_record("n", 10 * GIB, -GIB, None), _record("h", 1e-300, 1e300, None), _record("s", 10 * GIB, 11 * GIB, "big"),
           _record("x", 10 * GIB, 11 * GIB, 1e30), _record("b", 10 * GIB, 11 * GIB, True),
           _record("r", 10 * GIB, 9 * GIB, None), _record("f", float("nan"), 11 * GIB, None)]
    margin, context, used, rejected = measured_margins([good, *bad])
    assert margin == pytest.approx(0.1) and context == 500 * 2**20 and rejected == len(bad)
    assert measured_margins(bad)[:2] == (None, None)
    # a negative context is the meters' reading order, skipped as before; zeros say nothing: neither is counted
    quiet = [_record("q", 10 * GIB, 11 * GIB, -2**20), _record("z", 0, 0, None)]
    assert measured_margins(quiet) == (pytest.approx(0.1), None, 1, 0)


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
