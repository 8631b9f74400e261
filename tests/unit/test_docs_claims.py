"""The docs' measured tables are recomputed from the committed consoles and records they name.

docs/optimize.md's CPU table: each row names its run under ``results/reference-optimize-cpu/``; its
optimum, peaks and tokens/s are read back from that run's console (the verify line of the optimum), its
records agree with the console, and the bullets' summary figures (peaks equal to the byte, the spread of
measured against predicted tokens/s) follow from the rows.
"""

from __future__ import annotations

import re
from pathlib import Path

from ckptbench.store.records import load_records

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "results" / "reference-optimize-cpu"
OPTIMIZE = (ROOT / "docs" / "optimize.md").read_text()


def number(text: str) -> float:
    return float(text.replace(",", ""))


def cpu_rows() -> list[dict]:
    section = OPTIMIZE[OPTIMIZE.index("## Measured"):OPTIMIZE.index("**Llama-8B on an H100")]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and (RUNS / cells[0]).is_dir():
            run, _model, _budget, optimum, peaks, tokens = cells
            name, batch = re.fullmatch(r"(\S+) · batch (\d+)", optimum).groups()
            pred_peak, meas_peak = (number(x) for x in peaks.split(" = "))
            t = re.fullmatch(r"([0-9,]+) → ([0-9,]+) \[([0-9,]+), ([0-9,]+)\]", tokens).groups()
            rows.append({"run": run, "name": name, "batch": int(batch), "peaks": (pred_peak, meas_peak),
                         "tokens": tuple(number(x) for x in t)})
    return rows


def verify_line(run: str) -> dict:
    console = (RUNS / run / "console.log").read_text()
    assert console.rstrip().endswith("exit 0")
    m = re.search(r"^optimum (\S+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9,]+)\s+([0-9,]+) \[([0-9,]+), ([0-9,]+)\]"
                  r"\s+ok \(measured peak = predicted\)$", console, re.M)
    assert m, f"{run}: no verify line of the optimum"
    g = m.groups()
    return {"name": g[0], "batch": int(g[1]), "peaks": (float(g[2]), float(g[3])),
            "tokens": tuple(number(x) for x in g[4:])}


def test_every_row_of_the_cpu_table_is_its_runs_console():
    rows = cpu_rows()
    assert len(rows) == 6
    for row in rows:
        seen = verify_line(row["run"])
        assert {k: row[k] for k in seen} == seen, row["run"]


def test_the_consoles_peaks_are_the_records_to_the_byte():
    for row in cpu_rows():
        records = [r for r in load_records(str(RUNS / row["run"] / "run")).records if r["status"] == "ok"]
        optimum = [r for r in records if r["case"]["batch_size"] == row["batch"]]
        assert optimum, row["run"]
        peaks = {round(r["measurement"]["peak_bytes"] / 2**30, 4) for r in optimum}
        assert row["peaks"][1] in peaks


def test_the_bullets_summary_follows_from_the_rows():
    rows = cpu_rows()
    assert all(pred == meas for pred, meas in (r["peaks"] for r in rows))
    assert "**Memory: exact.** Every measured peak equals its prediction to the byte" in OPTIMIZE
    errors = [(r["tokens"][1] / r["tokens"][0] - 1) * 100 for r in rows]
    bound, low, high = (float(x) for x in re.search(
        r"\*\*Step time: within ([0-9.]+) %\.\*\* Every measured median is within [0-9.]+ % of its predicted "
        r"tokens/s \(−([0-9.]+) % to\s+\+([0-9.]+) %\)", OPTIMIZE).groups())
    assert round(min(errors), 1) == -low and round(max(errors), 1) == high
    assert max(abs(e) for e in errors) <= bound < max(abs(e) for e in errors) + 0.2


SWEEPS = " ".join((ROOT / "docs" / "sweeps.md").read_text().split())


def test_the_memory_steps_cost_is_the_reference_runs():
    import statistics

    stated = re.search(r"in `results/reference-cpu-bench` it took ([0-9.]+)-([0-9.]+)× a timed step \(median "
                       r"([0-9.]+)×\), the step plus a fixed ([0-9.]+)-([0-9.]+) s of probes", SWEEPS)
    assert stated
    records = load_records(str(ROOT / "results" / "reference-cpu-bench")).records
    ratios = [r["harness_parts"]["memory_step_over_timed_step"] for r in records]
    extra = [r["measurement"]["steps_wall_s"]["memory"]
             - r["measurement"]["steps_wall_s"]["timed"] / r["measurement"]["timed_steps"] for r in records]
    low, high, median, fixed_low, fixed_high = (float(g) for g in stated.groups())
    assert (low, median, high) == (round(min(ratios), 1), round(statistics.median(ratios), 1), round(max(ratios), 1))
    assert (fixed_low, fixed_high) == (round(min(extra), 2), round(max(extra), 2))


def test_the_frozen_heaps_saving_is_the_before_and_after_runs():
    stated = re.search(r"which took ([0-9.]+)-([0-9.]+) s off the memory step at each of (\d+) points with every "
                       r"peak the same to the byte \(`results/reference-memory-step-gc`", SWEEPS)
    assert stated
    runs = ROOT / "results" / "reference-memory-step-gc"
    before, after = ({r["case_id"]: r["measurement"] for r in load_records(str(runs / side)).records}
                     for side in ("before", "after"))
    assert sorted(before) == sorted(after) and len(before) == int(stated.group(3))
    saved = [before[k]["steps_wall_s"]["memory"] - after[k]["steps_wall_s"]["memory"] for k in before]
    assert (float(stated.group(1)), float(stated.group(2))) == (round(min(saved), 2), round(max(saved), 2))
    assert all(before[k]["peak_bytes"] == after[k]["peak_bytes"] for k in before)


def _accuracy_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("step_time_accuracy", ROOT / "scripts" / "step_time_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _figures(rows: list[dict]) -> tuple:
    """(predicted, within ±10 %, within ±25 %, mean |error| %, largest %), as the docs round them."""
    errors = [abs(r["error"]) for r in rows if "error" in r]
    return (len(errors), sum(e <= 0.10 for e in errors), sum(e <= 0.25 for e in errors),
            round(100 * sum(errors) / len(errors), 1), round(100 * max(errors), 1))


STEP_TIME = " ".join((ROOT / "docs" / "step-time-model.md").read_text().split())


def test_the_step_time_accuracy_tables_are_the_committed_grids_judged_twin_free():
    script = _accuracy_script()
    base = ROOT / "results" / "reference-step-time-accuracy" / "trace-based"
    for grid, label in (("grid-2", "grid 2 (load 1–2"), ("grid-3", "grid 3 (quiet"), ("grid-4", "grid 4 (2026-12-07")):
        rows = [row for m in ("llama", "qwen2", "gpt2") for row in script.held_out(str(base / grid / m))]
        cells = re.search(re.escape(label) + r"[^|]*\| (\d+) of (\d+) \| (\d+) of \d+ \| ([0-9.]+) % \| ([0-9.]+) % \|",
                          STEP_TIME)
        assert cells, label
        n10, n, n25, mean, largest = cells.groups()
        assert _figures(rows) == (int(n), int(n10), int(n25), float(mean), float(largest))


def test_the_bench_runs_accuracy_and_the_cross_shape_fit_are_its_records():
    script = _accuracy_script()
    run = str(ROOT / "results" / "reference-cpu-bench")
    same = _figures(script.held_out(run))
    stated = re.search(r"judged the same way, is within ±10 % at (\d+) of (\d+) \(mean \|error\| ([0-9.]+) %, "
                       r"largest ([0-9.]+) %\)", STEP_TIME)
    assert stated
    assert (same[1], same[0], same[3], same[4]) == (int(stated.group(1)), int(stated.group(2)),
                                                   float(stated.group(3)), float(stated.group(4)))
    other = _figures(script.held_out(run, other_shapes=True))
    cross = re.search(r"(\d+) of its (\d+) points have three measured shapes around them \(the grid's corners do "
                      r"not\); (\d+) of the \d+ are within ±10 %, (\d+) within ±25 %, mean \|error\| ([0-9.]+) %, "
                      r"largest ([0-9.]+) %", STEP_TIME)
    assert cross
    predicted, points, n10, n25, mean, largest = cross.groups()
    assert int(points) == 30 and other == (int(predicted), int(n10), int(n25), float(mean), float(largest))


def test_the_trackers_overhead_table_is_its_committed_measurement():
    """docs/track.md's overhead rows, and the sentence on the 1 % target, from the external measurement."""
    import json

    data = json.loads((ROOT / "results" / "reference-track-overhead" / "overhead.json").read_text())
    text = (ROOT / "docs" / "track.md").read_text()
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| (\S+), (\d+), (\d+) \(([0-9.]+) ms\) \| ([0-9.]+) s \| (\d+)-(\d+) \| ([0-9.]+) s "
                     r"\[([0-9.]+), ([0-9.]+)\] \|", line)
        if m:
            rows[(m[1], int(m[2]), int(m[3]))] = [float(x) for x in m.groups()[3:]]
    assert len(rows) == len(data["rows"]) == 3
    highs = []
    for row in data["rows"]:
        step_ms, wall, w_lo, w_hi, cost, lo, hi = rows[(row["model"], row["seq"], row["steps"])]
        assert all(r["status"] == "ok" for r in row["rounds_detail"])
        assert step_ms == round(row["step_s"] * 1e3, 1) and wall == round(row["plain_wall_s"], 2)
        assert (w_lo, w_hi) == (min(row["window_steps"]), max(row["window_steps"]))
        fixed = row["fixed_cost_s"]
        assert (cost, lo, hi) == tuple(round(x, 2) for x in (fixed["median"], *fixed["interval"]))
        assert round(fixed["coverage"], 3) == 0.969
        highs.append(fixed["interval"][1])
    assert f"at most {max(highs):.2f} s here, which is 1 % of a run of\n{max(highs) * 100:.0f} s" in text


def _history_tables():
    """docs/history.md's two tables as rendered from the committed measurements."""
    import json

    unchanged = json.loads((ROOT / "results" / "reference-history-unchanged" / "unchanged.json").read_text())
    scale = json.loads((ROOT / "results" / "reference-history-scale" / "scale.json").read_text())
    rows = ["| processes per measurement | pairs | step-time changes | significant (p < 0.05) | flagged | "
            "peak bytes differing |", "|---|---|---|---|---|---|"]
    for key, n in (("1_process", 1), ("3_process", 3)):
        pairs = unchanged[key]["pairs"]
        changes = [p["change"] for p in pairs]
        significant = [p for p in pairs if p["p_value"] is not None and p["p_value"] < 0.05]
        named = ", ".join(f"{p['change']:+.1%} (p = {p['p_value']:.3f})" for p in significant) or "none"
        rows.append(f"| {n} | {len(pairs)} | {min(changes):+.1%} to {max(changes):+.1%} | {named} | "
                    f"{unchanged[key]['flagged']} | {sum(p['peak_bytes_difference'] != 0 for p in pairs)} |")
    scale_rows = ["| commits × points | read and judged | drawn | page | memory commits flagged |", "|---|---|---|---|---|",
                  f"| {scale['commits']:,} × {scale['points']} | {scale['read_and_judge_s']:.1f} s | "
                  f"{scale['render_s']:.2f} s | {scale['page_bytes']:,} B | {scale['memory_commits_flagged']} "
                  "(of 9 planted) |"]
    return "\n".join(rows), "\n".join(scale_rows), unchanged, scale


def test_the_history_pages_tables_are_the_committed_measurements():
    unchanged_rows, scale_rows, unchanged, scale = _history_tables()
    text = (ROOT / "docs" / "history.md").read_text()
    assert unchanged_rows in text and scale_rows in text
    one = [p for p in unchanged["1_process"]["pairs"] if p["p_value"] < 0.05]
    assert [f"{p['change']:.1%}" for p in one] == ["7.5%"] and "moved by 7.5 %" in text and "(p = 0.024)" in text
    three = [p["change"] for p in unchanged["3_process"]["pairs"]]
    assert f"between {min(three) * 100:.1f} % and {max(three) * 100:+.1f} %" in text
    assert scale["total_s"] < 20 and scale["page_bytes"] < 20 * 10**6
