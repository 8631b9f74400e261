"""The planner's largest fitting batch against the largest batch that really fits, on CPU where the truth
is cheap: every strategy's predicted maximum runs within the budget and one more does not."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest

from ckptbench.point.case import preset
from ckptbench.point.training import TrainSpec
from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.store.records import load_records
from ckptbench.suite.parse import load_suite
from ckptbench.theory.memory.extrapolate import Simulated, extrapolation
from ckptbench.theory.policy.plan import Assumptions, plan, strategies

pytestmark = pytest.mark.e2e

BUDGET_GIB = 0.08
SEQ = 128


def _suite(name: str, batches: list[int], every_n: list[int], extra: str = "") -> str:
    """llama-small (eager) at SEQ, one step of each kind: the planner's model, run for real."""
    return (f'[suite]\nname = "{name}"\n{extra}\n[model]\npreset = "llama-small"\nattn = "eager"\n'
            f"[train]\nwarmup_steps = 1\nmemory_steps = 1\nsteps = 1\nmax_steps = 1\n"
            f"[sweep]\nbatch_size = {batches}\nseq_len = [{SEQ}]\nevery_n_layers = {every_n}\n")


@pytest.mark.slow
def test_the_largest_batch_the_planner_allows_is_the_largest_that_fits(tmp_path, write_suite):
    spec = preset("llama-small")
    options = {(o.every_n_layers, o.offload): o.max_batch
               for o in plan(spec, SEQ, Assumptions(int(BUDGET_GIB * 2**30), "cpu"), TrainSpec())}
    checked = {n: options[(n, False)] for n in (0, 1, 2)}
    assert all(b >= 1 for b in checked.values()) and len(set(checked.values())) == 3  # three different answers
    batches = sorted({b + k for b in checked.values() for k in (0, 1)})
    suite = load_suite(write_suite(_suite("plan-check", batches, [0, 1, 2], f"memory_budget_gib = {BUDGET_GIB}")))
    # only each strategy's predicted maximum and the batch above it are run: the other points of the
    # crossed axes (another strategy's batches) say nothing about this strategy's line
    wanted = {(n, b + k) for n, b in checked.items() for k in (0, 1)}
    suite = dataclasses.replace(suite, cases=tuple(c for c in suite.cases
                                                   if (c.every_n_layers, c.batch_size) in wanted))
    assert len(suite.cases) == len(wanted) == 6
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path / "run"), calibrate=False))  # statuses only: no timings
    status = {(r["case"]["every_n_layers"], r["case"]["batch_size"]): r["status"]
              for r in load_records(str(tmp_path / "run")).records}
    for n, b in checked.items():
        assert status[(n, b)] == "ok", (n, b)
        assert status[(n, b + 1)] == "over_budget", (n, b + 1)
    # the predictor for models without an analytic estimate (few-layer simulation, extrapolated) draws
    # the same line: its largest batches are the ones that really fit
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("fork")) as pool:
        simulated = Simulated(extrapolation(spec, SEQ, "cpu", offloads=(False,), across=False, mapper=pool.map))
    by_simulation = {(o.every_n_layers, o.offload): o.max_batch
                     for o in plan(spec, SEQ, Assumptions(int(BUDGET_GIB * 2**30), "cpu"), TrainSpec(),
                                   predict=simulated)}
    assert {n: by_simulation[(n, False)] for n in checked} == checked


def test_distinct_checkpointed_sets_only():
    assert strategies(4) == [(0, False), (1, False), (1, True), (2, False), (2, True), (3, False), (3, True),
                             (4, False), (4, True)]
    assert len(strategies(32)) == 1 + 2 * 32


def test_plan_for_an_8b_model_on_a_card_recommends_and_states_its_assumptions():
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "plan", "--model", "llama-8b", "--device", "h200",
                           "--seq", "8192", "--dtype", "bf16", "--attn", "sdpa"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    recommended = next(line for line in lines if line.startswith("recommended: "))
    assert "tokens/s predicted" in recommended and "runner-up" in recommended
    assert any(line.startswith("step time: expected (x") and "NVIDIA H200's; fitted on 42 points" in line
               for line in lines)
    assert any(line.startswith("assumed: ") and "datasheet NVIDIA H200 bf16" in line for line in lines)


@pytest.mark.slow
def test_verify_runs_the_recommendation_and_its_neighbours_beside_their_predicted_step_times(tmp_path):
    cmd = [sys.executable, "-m", "ckptbench", "plan", "--model", "llama-tiny", "--device", "cpu", "--memory",
           "0.005GiB", "--seq", "64", "--verify", "--out", str(tmp_path / "run"), "--baselines-dir", str(tmp_path / "rates")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = load_records(str(tmp_path / "run")).records
    assert 2 <= len(records) <= 3 and all(r["status"] == "ok" for r in records)
    assert "none of these points used to predict" in proc.stdout and "largest error" in proc.stdout
    # each record carries the plan's prediction, and the sweep's own from the points before it where they
    # give one (the first point has none): a prediction, never the verdict
    for r in records:
        assert r["plan_prediction"]["step_s"] > 0
        check = next(c for c in r["checks"] if c["quantity"] == "step_time_s")
        assert (check["verdict"] in ("agrees", "off") and check["estimated"] > 0
                or check["verdict"] == "skip" and "no measured baseline" in check["difference"])
        assert r["verdict"] != "skip"
    # the report of the verify run shows the plan, and each measured point beside its prediction
    html = tmp_path / "report.html"
    report = subprocess.run([sys.executable, "-m", "ckptbench", "report", str(tmp_path / "run"), "-o", str(html)],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    page = html.read_text()
    assert '<section id="plan"><h2>Plan</h2>' in page and "<strong>Recommended:</strong>" in page
    section = page[page.index('<section id="plan">'):]
    section = section[:section.index("</section>")]
    assert section.count("<tr><td>") == len(records)  # one row per measured point


@pytest.mark.slow
def test_an_ordinary_sweep_given_the_plan_sets_each_predicted_point_beside_its_prediction(tmp_path, write_suite):
    from ckptbench.report.plan_section import predicted_vs_measured

    planned = subprocess.run([sys.executable, "-m", "ckptbench", "plan", "--model", "llama-small", "--device", "cpu",
                              "--memory", f"{BUDGET_GIB}GiB", "--seq", str(SEQ), "--attn", "eager", "--json",
                              "--precision", "fp32", "--baselines-dir", str(tmp_path / "rates")],
                             capture_output=True, text=True, timeout=120)
    assert planned.returncode == 0, planned.stderr
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(planned.stdout)
    best = {o["every_n_layers"]: o["max_batch"] for o in json.loads(planned.stdout)["options"] if not o["offload"]}
    suite = write_suite(_suite("planned", [best[0], best[0] + 1], [0]))
    out = tmp_path / "run"
    bad = tmp_path / "bad.json"
    bad.write_text('{"options": "no"}')
    refused = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", suite, "--out", str(out),
                              "--plan", str(bad)], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not a `ckptbench plan --json` output" in refused.stderr
    assert "Traceback" not in refused.stderr and not (out / "records.jsonl").exists()
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", suite, "--out", str(out),
                           "--plan", str(plan_file)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = load_records(str(out)).records
    rows = predicted_vs_measured(records, json.loads((out / "plan.json").read_text()))
    # the plan predicted the largest batch only; the batch above it had no prediction
    assert [row["point"] for row in rows] == [f"none b={best[0]}"]
    assert rows[0]["peak_pred"] == rows[0]["peak_meas"]  # the analytic estimate is exact on CPU
