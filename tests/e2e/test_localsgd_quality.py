"""Local SGD on learnable text: held-out loss at fixed token counts, taken without disturbing training,
and the report's quality and projection sections drawn from those records.

One torchrun group of 2 CPU ranks runs every Case (16 optimizer steps each on the standard library's
bytes); the numbers are deterministic on CPU with one thread per rank, so they are compared exactly.
"""

import os
from dataclasses import replace

import pytest

from ckptbench.point.case import Case, DataSpec, preset
from ckptbench.point.training import TrainSpec
from ckptbench.report.render import render_report
from ckptbench.run.launch import flatten_measurement, run_distributed_cases
from ckptbench.store.records import RecordStore
from tests.e2e.report_html import Page

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # make test-all only: a training run to a held-out loss (31 s)

STEPS = 16
TEXT = DataSpec(source="stdlib", eval_every=4, eval_batches=4)


def case(k: int, seed: int = 0, data: DataSpec = TEXT) -> Case:
    train = TrainSpec(steps=STEPS - 1, warmup_steps=1, memory_steps=1, seed=seed, threads=1, lr=3e-3)
    return Case(model=preset("llama-tiny"), train=train, batch_size=4, seq_len=64, local_sgd_steps=k,
                world_size=2, data=data)


CASES = {"ddp": case(0), "k4": case(4), "ddp-s1": case(0, seed=1), "k4-s1": case(4, seed=1),
         "k4-no-eval": case(4, data=replace(TEXT, eval_every=0))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    results = run_distributed_cases(list(CASES.values()), str(tmp_path_factory.mktemp("quality")), 600)
    out = {}
    for name, r in zip(CASES, results):
        assert r["status"] == "ok", f"{name}: {r['reason']}\n{r['stderr_tail']}"
        out[name] = r["measurement"]
    return out


def curve(m: dict) -> list[dict]:
    return m["summary"]["eval_curve"]


def test_held_out_loss_is_taken_at_fixed_token_counts(runs):
    tokens_per_step = CASES["ddp"].tokens_per_step
    for name in ("ddp", "k4"):
        c = curve(runs[name])
        assert [e["step"] for e in c] == [0, 4, 8, 12, 16]
        assert [e["tokens"] for e in c] == [s * tokens_per_step for s in (0, 4, 8, 12, 16)]
    # same initial weights, same held-out tokens: every K starts from the same loss
    assert curve(runs["ddp"])[0]["loss"] == curve(runs["k4"])[0]["loss"]


def test_ddp_learns_the_text(runs):
    c = curve(runs["ddp"])
    assert c[0]["loss"] - c[-1]["loss"] >= 1.0  # nats: byte-level Python is learnable, random ids are not


def test_evaluating_does_not_change_training(runs):
    with_eval, without = runs["k4"], runs["k4-no-eval"]
    for a, b in zip(with_eval["ranks"], without["ranks"]):
        assert [s["loss"] for s in a["steps"]] == [s["loss"] for s in b["steps"]]
    assert curve(with_eval)[-1]["loss"] == curve(without)[-1]["loss"]
    assert [e["step"] for e in curve(without)] == [0, STEPS]


def test_text_changes_no_byte_of_communication(runs):
    for name in ("ddp", "k4"):
        assert runs[name]["summary"]["estimate_matches"]
        assert runs[name]["ranks"][0]["data"]["description"].endswith(".py files")


def test_report_draws_quality_and_projection(runs, tmp_path):
    store = RecordStore(str(tmp_path / "run"))
    store.ensure()
    for name in ("ddp", "k4", "ddp-s1", "k4-s1"):
        c = CASES[name]
        store.append({"case_id": c.id, "repeat": 0, "repeats": 1, "suite": "quality-e2e", "case": c.to_dict(),
                      "strategy": c.strategy, "status": "ok", "reason": "",
                      "measurement": flatten_measurement(c, runs[name]), "env": {}})
    out = render_report(store.run_dir, str(tmp_path / "report.html"))
    with open(out) as fh:
        html = fh.read()
    page = Page(html)
    quality = page.tables["quality"]
    assert [row[0] for row in quality] == ["DDP", "K=4"]
    assert [row[1] for row in quality] == ["2", "2"]  # seeds
    gap = [runs[n]["summary"]["eval_curve"][-1]["loss"] - runs[d]["summary"]["eval_curve"][-1]["loss"]
           for n, d in (("k4", "ddp"), ("k4-s1", "ddp-s1"))]
    assert quality[1][3] == f"{(gap[0] + gap[1]) / 2:+.4f}"  # the mean of the two seeds' paired gaps
    assert quality[1][5] == "min–max of 2 seeds"  # and the interval says what it is
    assert "Held-out loss vs tokens per K." in html and "Communication saved vs held-out loss gap." in html
    network = page.tables["network"]
    assert [row[0] for row in network] == ["DDP", "K=4"]
    assert "PROJECTION, not a measurement" in html and "Crossover K" in html
    assert os.path.getsize(out) > 0
