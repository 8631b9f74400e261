"""Real 2-rank FSDP2 groups on llama-tiny (gloo, CPU): collectives equal the formula to the byte, each
rank's exact memory meets the per-rank estimate.

One torchrun group runs both points (none, full), because a torchrun start-up costs seconds.
"""


import pytest

from ckptbench.run.launch import flatten_measurement, run_distributed_cases
from ckptbench.spec import Case, Setup, TrainSpec, preset
from ckptbench.theory.annotate import annotate_record
from ckptbench.theory.fsdp import PEAK_TOLERANCE, fsdp_case_comm, fsdp_memory_estimate

pytestmark = pytest.mark.e2e

TRAIN = TrainSpec(steps=1, warmup_steps=1, memory_steps=1, seed=0, threads=1)


def case(every_n: int) -> Case:
    return Case(model=preset("llama-tiny"), train=TRAIN, batch_size=2, seq_len=32, every_n_layers=every_n,
                world_size=2, setup=Setup(sharding="fsdp"))


CASES = {"none": case(0), "full": case(1)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("fsdp")
    results = run_distributed_cases(list(CASES.values()), str(work), 600)
    out = {}
    for (name, c), r in zip(CASES.items(), results):
        assert r["status"] == "ok", f"{name}: {r['reason']}\n{r['stderr_tail']}"
        out[name] = flatten_measurement(c, r["measurement"])
    return out


@pytest.mark.parametrize("name", CASES)
def test_collectives_equal_the_formula(runs, name):
    m, est = runs[name], fsdp_case_comm(CASES[name])
    # 3 micro-batches x (2 gathers x 4 layers + 1 root): checkpointing adds no gather
    assert m["allgather_count"] == est["allgather_count"] == 27
    assert m["reduce_scatter_count"] == est["reduce_scatter_count"] == 15
    for rank in range(2):
        assert m["allgather_payload_bytes_per_rank"][rank] == est["allgather_payload_bytes"] == 1_972_608
        assert m["reduce_scatter_payload_bytes_per_rank"][rank] == est["reduce_scatter_payload_bytes"] == 2_169_600
    assert m["distributed"]["summary"]["allreduce_payload_bytes_per_rank"] == [0, 0]  # no DDP all-reduce


@pytest.mark.parametrize("name", CASES)
def test_rank_memory_meets_the_estimate(runs, name):
    m, est = runs[name], fsdp_memory_estimate(CASES[name])
    ranks = m["distributed"]["ranks"]
    for r in ranks:
        mem = r["memory"][0]
        assert mem["params_bytes"] == est["params_bytes"]  # the padded shards and the buffers
        assert mem["optimizer_bytes"] == est["optimizer_bytes"]
        # inside a layer's backward: shards + the unsharded root + one unsharded layer, seen through resize_
        assert mem["peak_breakdown"]["params"] == est["peak_params_bytes"]
        assert mem["peak_phase"] == "backward"
        assert abs(mem["peak_bytes"] / est["peak_bytes"] - 1) <= PEAK_TOLERANCE
    # both ranks run the same shapes: the exact tracker sees the same bytes on each
    assert ranks[0]["memory"][0]["peak_bytes"] == ranks[1]["memory"][0]["peak_bytes"]
    # checkpointing lowers the per-rank peak under FSDP as it does on one process
    if name == "full":
        assert m["peak_bytes"] < runs["none"]["peak_bytes"]


@pytest.mark.parametrize("name", CASES)
def test_record_checks_pass(runs, name):
    record = {"status": "ok", "measurement": runs[name]}
    annotate_record(CASES[name], record)
    failed = [c for c in record["checks"] if c["verdict"] != "pass"]
    assert record["verdict"] == "pass", failed
    assert {c["quantity"] for c in record["checks"]} >= {"allgather_payload_bytes", "reduce_scatter_payload_bytes",
                                                         "peak_breakdown.params", "peak_bytes"}
