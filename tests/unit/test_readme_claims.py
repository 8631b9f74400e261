"""Every number the README states is recomputed here from the committed records it names.

Each test reads a figure from the README's own text (never a copy of it kept here), recomputes it from
the run directory the sentence names, and compares them with the tolerance the sentence implies: a count
exactly, "4 minutes 21 s" to the second, "5.5 minutes" to the tenth, a block of output line for line.
A sentence that changes without its records, or records that change without the sentence, fail here.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from ckptbench.store.records import load_records

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PROSE = " ".join(README.split())  # the README with its line breaks as spaces: a sentence may wrap anywhere
CPU_RUN = ROOT / "results" / "reference-cpu-bench"
H200_RUN = ROOT / "results" / "h200-20261204-gpu-small"


def squash(text: str) -> str:
    return " ".join(text.split())


def text_block_after(marker: str) -> str:
    """The first ```text block after `marker` in the README."""
    at = README.index(marker)
    match = re.search(r"```text\n(.*?)```", README[at:], re.S)
    assert match, f"no text block after {marker!r}"
    return match.group(1)


def sweep_seconds(console: Path) -> float:
    """What the sweep printed as its own duration (its console, committed beside its records)."""
    found = re.findall(r"the sweep took ([0-9.]+) s", console.read_text())
    assert len(found) == 1, f"{console}: {len(found)} 'the sweep took' lines"
    return float(found[0])


def ok_records(run: Path) -> list[dict]:
    loaded = load_records(str(run))
    assert loaded.problems == [], loaded.problems
    return loaded.records


def test_the_cpu_answers_are_the_committed_bench_runs_summary():
    from ckptbench.report.headline import budgets_of, summary_lines
    from ckptbench.suite.parse import load_suite

    suite = load_suite(str(CPU_RUN / "suite.toml"))
    lines = [line for line in summary_lines(ok_records(CPU_RUN), budgets_of(suite.budgets_gib))
             if line.startswith(("seq 1024: fastest within 0.25 GiB", "seq 1024: fastest within 0.5 GiB"))]
    assert len(lines) == 2
    block = text_block_after("**At 1,024 tokens")
    assert squash(block) == squash(" ".join(lines))


def test_the_cpu_bench_points_duration_and_stops_are_its_records():
    records = ok_records(CPU_RUN)
    sentence = re.search(r"elsewhere `suites/cpu.toml` \((\d+) points, (\d+) minutes (\d+) s of sweep on 2 cores "
                         r"\(`make bench`, \[`results/reference-cpu-bench`\]", PROSE)
    assert sentence, "the README's sentence about the CPU bench is not where this test reads it"
    points, minutes, seconds = (int(g) for g in sentence.groups())
    assert points == len(records) and {r["status"] for r in records} == {"ok"}
    assert minutes * 60 + seconds == round(sweep_seconds(CPU_RUN / "console.log"))

    stops = re.search(r"(\d+) of its (\d+) points stopped at ±2 %, the others at a cap \(median half-width "
                      r"([0-9.]+) %, largest ([0-9.]+) %\)", PROSE)
    assert stops, "the README's sentence about where the CPU bench's timing stopped is not where this test reads it"
    measured = [r["measurement"] for r in records]
    by_precision = sum(m["timing_stopped_by"] == "precision" for m in measured)
    widths = []
    for m in measured:
        low, high = m["step_time_ci95_s"]
        median = m["step_time_median_s"]
        widths.append(max(median - low, high - median) / median * 100)
    assert int(stops.group(1)) == by_precision and int(stops.group(2)) == len(records)
    assert float(stops.group(3)) == pytest.approx(statistics.median(widths), abs=0.05)
    assert float(stops.group(4)) == pytest.approx(max(widths), abs=0.05)


def test_the_earlier_timed_runs_stops_are_its_records():
    stated = re.search(r"\[`reference-cpu-timed`\]\(reports/reference-cpu-timed.html\) \(the same suite at earlier caps, "
                       r"[0-9-]+: (\d+) of (\d+) points stopped at ±2 %\)", PROSE)
    assert stated
    records = ok_records(ROOT / "results" / "reference-cpu-timed")
    by_precision = sum(r["measurement"]["timing_stopped_by"] == "precision" for r in records)
    assert (int(stated.group(1)), int(stated.group(2))) == (by_precision, len(records))


def test_the_h200_bench_points_and_duration_are_its_records():
    sentence = re.search(r"`suites/gpu-small.toml` \((\d+) points, ([0-9.]+) minutes of sweep on one H200", PROSE)
    assert sentence
    records = ok_records(H200_RUN / "run")
    assert int(sentence.group(1)) == len(records) and {r["status"] for r in records} == {"ok"}
    assert float(sentence.group(2)) == round(sweep_seconds(H200_RUN / "gpu_check.log") / 60, 1)


def test_the_plan_block_is_what_plan_prints(capsys):
    """The README's plan output, line for line (its '...' stands for rows left out), from the command above it."""
    from ckptbench.cli import main

    command = re.search(r"python -m ckptbench (plan --model llama-8b[^\n]*)", README).group(1)
    assert main(command.split()) == 0
    printed = capsys.readouterr().out.splitlines()
    shown = [line for line in text_block_after(command).splitlines() if line.strip() and line.strip() != "..."]
    assert shown and shown[0] == printed[0]
    missing = [line for line in shown if line not in printed]
    assert missing == []
    assert [printed.index(line) for line in shown] == sorted(printed.index(line) for line in shown)
