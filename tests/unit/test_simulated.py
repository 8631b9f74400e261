"""simulate-suite: one prediction line per Case keyed by case_id, and its loader."""

from __future__ import annotations

import json

from ckptbench.suite.parse import parse_suite
from ckptbench.theory.memory import simulated

SUITE = """
[suite]
name = "t"
[model]
preset = "llama-tiny"
[sweep]
batch_size = [1, 2]
seq_len = [16]
every_n_layers = [0, 1]
"""


class _Result:
    def __init__(self, peak):
        self.peak = peak

    def to_dict(self):
        return {"peak_bytes": self.peak}


def _fake_simulate(spec, batch, seq, every_n_layers=0, offload=False, lr=1e-4, device="cpu", setup=None):
    if batch == 2 and every_n_layers == 1:
        raise RuntimeError("boom")
    return _Result(1000 * batch + every_n_layers)


def test_simulate_suite_writes_one_line_per_case(tmp_path):
    suite = parse_suite(SUITE)
    path = simulated.simulate_suite(suite, str(tmp_path), simulate=_fake_simulate)
    lines = [json.loads(x) for x in open(path)]
    assert [x["case_id"] for x in lines] == [c.id for c in suite.cases]
    loaded = simulated.load_simulated(str(tmp_path))
    by_case = {c.id: c for c in suite.cases}
    for cid, line in loaded.items():
        c = by_case[cid]
        if c.batch_size == 2 and c.every_n_layers == 1:
            assert line["status"] == "error" and "boom" in line["reason"]
        else:
            assert line["simulated"]["peak_bytes"] == 1000 * c.batch_size + c.every_n_layers
    # a second run redoes only the failed point; the last line of a Case wins in the loader
    simulated.simulate_suite(suite, str(tmp_path), simulate=lambda *a, **k: _Result(7))
    assert len(open(path).readlines()) == len(suite.cases) + 1
    assert all(v["status"] == "ok" for v in simulated.load_simulated(str(tmp_path)).values())


def test_loader_without_file_and_with_a_torn_line(tmp_path):
    assert simulated.load_simulated(str(tmp_path)) == {}
    (tmp_path / "simulated.jsonl").write_text('{"case_id": "a", "status": "ok"}\n{"case_id": "b", "sta')
    assert list(simulated.load_simulated(str(tmp_path))) == ["a"]
