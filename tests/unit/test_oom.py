"""CUDA out-of-memory becomes a result with status oom, whichever way torch raises it."""

from __future__ import annotations

import json
import multiprocessing

import torch

from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run import worker


def test_cuda_oom_is_the_class_child_main_catches():
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError


def test_oom_messages_outside_the_allocator():
    assert worker.is_oom_error(RuntimeError("CUDA error: out of memory\nCUDA kernel errors ..."))
    assert worker.is_oom_error(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert not worker.is_oom_error(RuntimeError("shape mismatch"))
    assert not worker.is_oom_error(ValueError("out of memory"))


def _raise_oom(case, t_submit=None, fault=None, timeout_s=None):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def _raise_runtime_oom(case, t_submit=None, fault=None, timeout_s=None):
    raise RuntimeError("CUDA error: out of memory")


def _run_child(tmp_path, measure, monkeypatch) -> dict:
    # child_main redirects its process's stdout/stderr, so it runs in a forked child (which inherits
    # the patched measure), exactly as a sweep worker would.
    monkeypatch.setattr(worker, "measure", measure)
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8)
    result_path, log_path = str(tmp_path / "r.json"), str(tmp_path / "w.log")
    proc = multiprocessing.get_context("fork").Process(
        target=worker.child_main, args=(case.to_dict(), result_path, log_path, 0.0))
    proc.start()
    proc.join(60)
    with open(result_path) as fh:
        return json.load(fh)


def test_child_main_records_oom(tmp_path, monkeypatch):
    result = _run_child(tmp_path, _raise_oom, monkeypatch)
    assert result["status"] == "oom"
    assert "Tried to allocate" in result["reason"]


def test_child_main_records_runtime_oom(tmp_path, monkeypatch):
    result = _run_child(tmp_path, _raise_runtime_oom, monkeypatch)
    assert result["status"] == "oom"


def _allocate_a_quarter_terabyte(case, t_submit=None, fault=None, timeout_s=None):
    # a real request to torch's CPU allocator that no machine here can satisfy: it fails at once
    # (the kernel refuses the mapping), as a too large point's activations would
    torch.empty(2**38, dtype=torch.uint8)


def test_cpu_allocator_failure_is_oom(tmp_path, monkeypatch):
    result = _run_child(tmp_path, _allocate_a_quarter_terabyte, monkeypatch)
    assert result["status"] == "oom", result
    assert "can't allocate memory" in result["reason"] and "274877906944 bytes" in result["reason"]
