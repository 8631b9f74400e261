"""Offload on two DDP ranks on a CPU-only torch: transformers' offload runs unpinned, as on one process,
instead of failing on the first checkpointed layer (pinned memory needs an accelerator)."""

import pytest

from ckptbench.run.launch import run_distributed_cases
from ckptbench.spec import Case, TrainSpec, preset
from ckptbench.train.checkpointing import pinned_memory_error

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(pinned_memory_error() is None, reason="this torch build can pin host memory")
def test_ddp_offload_runs_unpinned_on_a_cpu_only_build(tmp_path):
    case = Case(model=preset("llama-tiny"), train=TrainSpec(steps=1, warmup_steps=1), batch_size=2, seq_len=32,
                every_n_layers=2, offload=True, world_size=2)
    result = run_distributed_cases([case], str(tmp_path), 600)[0]
    assert result["status"] == "ok", result["reason"] + "\n" + result["stderr_tail"]
    assert [r["offload_pinned"] for r in result["measurement"]["ranks"]] == [False, False]
