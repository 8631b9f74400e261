"""asv over a repository of four commits, measured by ckptbench's benchmarks, judged by ``ckptbench history``.

The commits: a training step (base); a README edit (unchanged); the step trains on its batch twice over
(activation memory doubles, the Case the tracker reads stays the same); a sleep in the step (slower, the
same bytes).  asv runs each as CI would (``asv run --python=same --set-commit-hash HEAD``); each commit's
step is measured in three processes (step_benchmark's default).

Time is judged at a 25 % threshold here, not the default 10 %: this test shares 2 cores with the rest of
the suite, and the slowdown it plants is 15-fold.  Memory is judged at the default, exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ckptbench.history.series import build_history

pytestmark = pytest.mark.e2e

CONF = {"version": 1, "project": "proj", "repo": ".", "branches": ["main"], "environment_type": "existing",
        "benchmark_dir": "benchmarks", "results_dir": "results", "html_dir": "html"}

BENCH = '''import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ckptbench.history.benchmark import step_benchmark  # noqa: E402
from proj.step import build  # noqa: E402

Training = step_benchmark(tiny=build)
'''

STEP = '''import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def build():
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128, vocab_size=256)
    model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, 256, (2, 32))
    trained = BATCH

    def step():
        model(input_ids=trained, labels=trained).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        SLEEP

    return model, optimizer, batch, step
'''

COMMITS = [  # message, step.py's batch, its pause, README
    ("base", "batch", "pass", "a step\n"),
    ("docs only", "batch", "pass", "a training step, measured\n"),
    ("train on the batch twice over", "torch.cat([batch, batch])", "pass", "a training step, measured\n"),
    ("pause in the step", "torch.cat([batch, batch])", "time.sleep(0.1)", "a training step, measured\n"),
]


def _run(args, cwd, env):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def history_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    env = {**os.environ, "HOME": str(tmp_path_factory.mktemp("home")), "OMP_NUM_THREADS": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    (repo / "benchmarks").mkdir()
    (repo / "proj").mkdir()
    (repo / "asv.conf.json").write_text(json.dumps(CONF))
    (repo / "benchmarks" / "__init__.py").write_text("")
    (repo / "benchmarks" / "training.py").write_text(BENCH)
    (repo / "proj" / "__init__.py").write_text("")
    (repo / ".gitignore").write_text("results/\nhtml/\n")
    _run(["git", "init", "-q", "-b", "main"], repo, env)
    asv = [sys.executable, "-m", "asv"]
    _run([*asv, "machine", "--yes", "--machine", "box"], repo, env)
    hashes = []
    for message, batch, pause, readme in COMMITS:
        (repo / "proj" / "step.py").write_text(STEP.replace("BATCH", batch).replace("SLEEP", pause))
        (repo / "README").write_text(readme)
        _run(["git", "add", "-A"], repo, env)
        _run(["git", "commit", "-q", "-m", message], repo, env)
        hashes.append(_run(["git", "rev-parse", "HEAD"], repo, env).strip())
        _run([*asv, "run", "--python=same", "--set-commit-hash", "HEAD", "--machine", "box"], repo, env)
    return repo, hashes


def test_history_finds_the_memory_and_the_time_change_and_nothing_else(history_repo):
    repo, hashes = history_repo
    history = build_history(str(repo / "results"), time=0.25)
    assert history.problems == [] and history.failed == []
    (series,) = history.series
    assert [c.commit for c in series.commits] == hashes  # in asv's commit order
    base, docs, doubled, slowed = series.commits
    assert base.changes == [] and docs.changes == []
    memory = [c for c in doubled.changes if c.quantity == "peak_bytes"]
    assert memory and memory[0].direction == "regression"
    (case_id,) = series.values
    peaks = series.values[case_id]["peak_bytes"]
    # counted on CPU, the same every run: the base step's peak, and the batch trained twice over
    assert peaks == [2_092_700, 2_092_700, 2_899_868, 2_899_868]
    assert memory[0].old == peaks[1] and memory[0].new == peaks[2] and memory[0].evidence.endswith(
        f"({peaks[2] - peaks[1]:+,.0f} B)")
    assert [c.quantity for c in slowed.changes] == ["step_time_median_s"] or {
        c.quantity for c in slowed.changes} == {"step_time_median_s", "tokens_per_s"}
    assert all(c.direction == "regression" and "Welch" in c.evidence for c in slowed.changes)
    assert history.latest_regressed == [series]


def test_history_command_exits_1_on_the_newest_commits_regression_and_writes_the_page(history_repo, tmp_path):
    repo, hashes = history_repo
    page = tmp_path / "history.html"
    done = subprocess.run([sys.executable, "-m", "ckptbench", "history", str(repo / "results"), "--fail-time", "25%",
                           "--html", str(page)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert f"{hashes[2][:12]} regression" in done.stdout and f"{hashes[3][:12]} regression" in done.stdout
    assert hashes[1][:12] not in done.stdout
    assert "<polyline" in page.read_text()
