"""A point spanning two "hosts": two torchrun agents on this machine meet at a c10d rendezvous endpoint,
one rank each, and must measure what one agent with two ranks measures, byte for byte and loss for loss.

Each agent is started as a sweep on its host starts it (its own work directory, ``Nodes(node_rank=i)``),
and each writes the whole result, so both "hosts" hold the record.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from ckptbench.point.case import Case, DataSpec, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run.launch import free_port, run_distributed_cases
from ckptbench.run.nodes import Nodes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # make test-all only: two hosts of torchrun groups (95 s)

TRAIN = TrainSpec(steps=7, warmup_steps=1, memory_steps=1, seed=0, threads=1, lr=3e-3)
DATA = DataSpec(source="stdlib", eval_every=4, eval_batches=4)
CASES = [Case(model=preset("llama-tiny"), train=TRAIN, batch_size=2, seq_len=32, local_sgd_steps=k,
              world_size=2, data=DATA) for k in (0, 4)]


def _ok(results: list[dict]) -> list[dict]:
    for r in results:
        assert r["status"] == "ok", f"{r['reason']}\n{r['stderr_tail']}"
    return [r["measurement"] for r in results]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    single = _ok(run_distributed_cases(CASES, str(tmp_path_factory.mktemp("one-node")), 300))
    endpoint = f"127.0.0.1:{free_port()}"

    def node(rank: int) -> list[dict]:
        nodes = Nodes(nnodes=2, node_rank=rank, rdzv_endpoint=endpoint, local_addr="127.0.0.1")
        return _ok(run_distributed_cases(CASES, str(tmp_path_factory.mktemp(f"node{rank}")), 300, nodes=nodes))

    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(node, (0, 1)))
    return single, both


def _comm(m: dict) -> list:
    return [(r["total"]["ops"].get("allreduce", {}).get("payload_bytes"),
             r["total"]["ops"].get("allreduce", {}).get("count"), r["syncs_observed"]) for r in m["ranks"]]


def _losses(m: dict) -> list:
    return [[s["loss"] for s in r["steps"]] for r in m["ranks"]]


@pytest.mark.parametrize("i", [0, 1], ids=["ddp", "K4"])
def test_two_nodes_measure_what_one_node_measures(runs, i):
    single, both = runs
    for node_result in both:  # each "host" wrote the whole result
        m = node_result[i]
        assert m["summary"]["estimate_matches"]
        assert _comm(m) == _comm(single[i])
        assert sorted(_losses(m)) == sorted(_losses(single[i]))  # rank r trains shard r, wherever it runs
        assert [e["loss"] for e in m["summary"]["eval_curve"]] == [e["loss"] for e in single[i]["summary"]["eval_curve"]]


def test_each_node_ran_one_rank(runs):
    _, both = runs
    assert [m["ranks"][0]["world_size"] for m in both[0]] == [2, 2]
    assert both[0][0]["ranks"] == both[1][0]["ranks"]  # the same gathered result on both hosts


SUITE = """
[model]
preset = "llama-tiny"
attn = "eager"
[train]
warmup_steps = 1
steps = 3
max_steps = 3
threads = 1
[data]
source = "stdlib"
[sweep]
batch_size = [2]
seq_len = [32]
world_size = [2]
local_sgd_steps = [2]
"""


def test_each_host_runs_the_same_sweep_and_records_the_point(tmp_path):
    import json
    import subprocess
    import sys

    suite = tmp_path / "two-hosts.toml"
    suite.write_text(SUITE)
    endpoint = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, "-m", "ckptbench", "sweep", "--suite", str(suite), "--out",
                               str(tmp_path / f"host{i}"), "--nnodes", "2", "--node-rank", str(i), "--rdzv-endpoint",
                               endpoint, "--local-addr", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in (0, 1)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    records = []
    for i in (0, 1):
        with open(tmp_path / f"host{i}" / "records.jsonl") as fh:
            (record,) = [json.loads(line) for line in fh]
        records.append(record)
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert records[0]["case_id"] == records[1]["case_id"]
    assert records[0]["measurement"]["comm_payload_bytes"] == records[1]["measurement"]["comm_payload_bytes"]
    assert records[0]["measurement"]["eval_curve"] == records[1]["measurement"]["eval_curve"]


def test_a_layout_torchrun_could_not_start_is_one_line(tmp_path):
    import subprocess
    import sys

    suite = tmp_path / "s.toml"
    suite.write_text(SUITE.replace("world_size = [2]", "world_size = [3]"))
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", str(suite), "--out",
                           str(tmp_path / "r"), "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "error: world_size 3 cannot be spread evenly over 2 nodes"
