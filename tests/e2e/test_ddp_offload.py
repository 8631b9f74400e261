"""Offload on two DDP ranks on a CPU-only torch: transformers' offload runs unpinned, as on one process,
instead of failing on the first checkpointed layer (pinned memory needs an accelerator); streamed offload
runs its hooks on every rank; the record states which offload ran and is judged on it."""

from dataclasses import replace

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.strategy import Recompute
from ckptbench.point.training import TrainSpec
from ckptbench.run.launch import flatten_measurement, run_distributed_cases
from ckptbench.theory.verdicts.annotate import annotate_record
from ckptbench.train.checkpointing import pinned_memory_error

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # make test-all only: two DDP ranks offloading (13 s)


@pytest.mark.skipif(pinned_memory_error() is None, reason="this torch build can pin host memory")
def test_ddp_offload_runs_unpinned_on_a_cpu_only_build(tmp_path):
    case = Case(model=preset("llama-tiny"), train=TrainSpec(steps=1, warmup_steps=1), batch_size=2, seq_len=32,
                every_n_layers=2, offload=True, world_size=2)
    streamed = replace(case, recompute=Recompute(offload="streamed"))
    results = run_distributed_cases([case, streamed], str(tmp_path), 600)
    for c, result, kind in zip((case, streamed), results, ("transformers", "streamed")):
        assert result["status"] == "ok", result["reason"] + "\n" + result["stderr_tail"]
        ranks = result["measurement"]["ranks"]
        assert [r["offload_pinned"] for r in ranks] == [False, False]
        assert [(r["offload_kind"], r["offload_moved"]) for r in ranks] == [(kind, False)] * 2  # a CPU moves nothing
        # the record states rank 0's facts, and the offload check judges them against the point
        record = {"status": "ok", "measurement": flatten_measurement(c, result["measurement"])}
        assert record["measurement"]["offload_kind"] == kind
        annotate_record(c, record)
        check = next(x for x in record["checks"] if x["quantity"] == "offload_kind")
        assert check["verdict"] == "pass" and check["estimated"] == kind
        wrong = {"status": "ok", "measurement": {**record["measurement"], "offload_kind": "transformers"}}
        annotate_record(streamed, wrong)  # a streamed point whose ranks ran transformers' offload fails
        assert wrong["verdict"] == "fail"
