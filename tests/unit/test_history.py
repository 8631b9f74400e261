"""The history from asv's results directory: commit order, exact memory changes, time changes by compare's
test, machines kept apart, and hostile files (one line each, nothing else lost)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys

import pytest

from ckptbench.history.asv_results import read_asv_results
from ckptbench.history.benchmark import MACHINE_FILE, RECORDS_DIR, kept, point_labels
from ckptbench.history.page import render
from ckptbench.history.series import build_history

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(ROOT, "results", "reference-cpu", "records.jsonl")


def reference_records(n: int = 2) -> list[dict]:
    with open(REFERENCE, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh][:n]


def write_commit(results, machine: str, env: str, commit: str, records: list[dict], date_ms: int | None,
                 parts: dict | None = None, asv_machine: str = "box") -> str:
    folder = os.path.join(results, RECORDS_DIR, machine)
    os.makedirs(os.path.join(folder, env, commit), exist_ok=True)
    with open(os.path.join(folder, MACHINE_FILE), "w") as fh:
        json.dump(parts or {"cpu": records[0]["env"]["cpu"], "cpu_count": records[0]["env"]["cpu_count"],
                            "accelerator": "none"}, fh)
    with open(os.path.join(folder, env, commit, "records.jsonl"), "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    if date_ms is not None:
        os.makedirs(os.path.join(results, asv_machine), exist_ok=True)
        with open(os.path.join(results, asv_machine, f"{commit[:8]}-{env}.json"), "w") as fh:
            json.dump({"commit_hash": commit, "env_name": env, "date": date_ms, "results": {}, "version": 2}, fh)
    return os.path.join(folder, env, commit)


def changed(records: list[dict], peak_delta: int = 0, time_factor: float = 1.0) -> list[dict]:
    out = copy.deepcopy(records)
    for r in out:
        m = r["measurement"]
        m["peak_bytes"] += peak_delta
        for key in ("step_times_s",):
            m[key] = [t * time_factor for t in m[key]]
        for key in ("step_time_median_s", "step_time_mean_s", "step_time_p90_s"):
            m[key] *= time_factor
        m["tokens_per_s"] /= time_factor
    return out


@pytest.fixture
def four_commits(tmp_path):
    base = reference_records()
    results = str(tmp_path / "results")
    commits = ["c" * 40, "a" * 40, "d" * 40, "b" * 40]  # not in name order: asv's dates give the order
    sides = [base, copy.deepcopy(base), changed(base, peak_delta=4096), changed(base, 4096, time_factor=3.0)]
    for i, (commit, records) in enumerate(zip(commits, sides)):
        write_commit(results, "m1", "env", commit, records, date_ms=1_000 * (i + 1))
    return results, commits, base


def test_commits_in_asv_date_order_memory_exact_time_by_its_test(four_commits):
    results, commits, base = four_commits
    history = build_history(results)
    assert history.problems == [] and history.failed == []
    (series,) = history.series
    assert [c.commit for c in series.commits] == commits
    first, same, memory, slower = series.commits
    assert first.changes == [] and same.changes == []
    assert {(c.case_id, c.quantity) for c in memory.changes} == {(r["case_id"], "peak_bytes") for r in base}
    assert all(c.new - c.old == 4096 and c.evidence.endswith("(+4,096 B)") for c in memory.changes)
    assert {c.quantity for c in slower.changes} == {"step_time_median_s", "tokens_per_s"}
    assert all(c.direction == "regression" and "Welch" in c.evidence for c in slower.changes)
    assert history.latest_regressed == [series]
    lines = series.values[base[0]["case_id"]]["peak_bytes"]
    assert lines == [base[0]["measurement"]["peak_bytes"]] * 2 + [base[0]["measurement"]["peak_bytes"] + 4096] * 2


def test_one_byte_more_is_flagged_on_cpu_and_not_under_a_threshold(tmp_path):
    base = reference_records(1)
    results = str(tmp_path)
    write_commit(results, "m", "e", "1" * 40, base, 1)
    write_commit(results, "m", "e", "2" * 40, changed(base, peak_delta=1), 2)
    (step,) = [c for c in build_history(results).series[0].commits if c.changes]
    assert [(c.quantity, c.new - c.old) for c in step.changes] == [("peak_bytes", 1)]
    assert not any(c.changes for c in build_history(results, memory=0.02).series[0].commits)


def test_machines_are_kept_apart_and_a_foreign_record_is_left_out(tmp_path):
    base = reference_records(2)
    results = str(tmp_path)
    write_commit(results, "m1", "e", "1" * 40, base, 1)
    write_commit(results, "m2", "e", "1" * 40, changed(base, peak_delta=10**6), 1,
                 parts={"cpu": "Other CPU", "cpu_count": 64})
    history = build_history(results)
    assert [s.machine for s in history.series] == ["m1", "m2"]
    assert history.series[1].commits[0].points == 0  # its records say another machine made them
    assert len(history.problems) == 2 and all("env.cpu" in p and "left out" in p for p in history.problems)


def test_a_torn_line_and_an_empty_commit_are_named_and_the_history_goes_on(four_commits):
    results, commits, base = four_commits
    path = os.path.join(results, RECORDS_DIR, "m1", "env", commits[1], "records.jsonl")
    with open(path, "a") as fh:
        fh.write('{"case_id": "torn"\n')
    empty = os.path.join(results, RECORDS_DIR, "m1", "env", "e" * 40)
    os.makedirs(empty)
    os.makedirs(os.path.join(results, RECORDS_DIR, "m1", "env", ".partial-x"))  # a killed run's work: not a commit
    history = build_history(results)
    (series,) = history.series
    assert len(series.commits) == 5
    assert any("skipped" in n or "line" in n for n in series.commits[1].notes)
    (no_records,) = [c for c in series.commits if c.commit == "e" * 40]
    assert "no record could be read" in " ".join(no_records.notes)
    assert [c.commit for c in series.commits if c.changes] == [commits[2], commits[3]]


def test_asv_files_that_are_not_asvs_are_one_line_each(tmp_path):
    box = tmp_path / "box"
    box.mkdir()
    (box / "machine.json").write_text("{}")
    (box / "a.json").write_text("{not json")
    (box / "b.json").write_text("[1, 2]")
    (box / "c.json").write_text(json.dumps({"commit_hash": 3, "env_name": "e"}))
    (box / "d.json").write_text(json.dumps({"commit_hash": "f" * 40, "env_name": "e", "date": "yesterday"}))
    (box / "e.json").write_text(json.dumps({
        "commit_hash": "9" * 40, "env_name": "e", "date": 5, "results": {
            "training.SuiteTraining.track_peak_bytes": [[1.0, None], [["'p1'", "'p2'"]]],
            "training.SuiteTraining.track_step_time": [None, [["'p1'", "'p2'"]]],
            "other.time_x": [None]}}))
    asv = read_asv_results(str(tmp_path))
    assert [p.split(": ", 1)[0] for p in asv.problems] == [str(box / n) for n in ("a.json", "b.json", "c.json", "d.json")]
    (run,) = asv.runs
    assert run.failed == ("training.SuiteTraining.track_peak_bytes('p2')", "training.SuiteTraining.track_step_time('p1')",
                          "training.SuiteTraining.track_step_time('p2')")
    history = build_history(str(tmp_path))
    assert len(history.failed) == 1 and "9" * 12 in history.failed[0]
    assert any("no ckptbench records" in p for p in history.problems)


def test_kept_replaces_a_commits_records_only_when_the_new_run_is_complete(tmp_path):
    final = str(tmp_path / "m" / "c1")
    kept(lambda out: open(os.path.join(out, "records.jsonl"), "w").write("first\n"), final)

    def dies(out):
        open(os.path.join(out, "records.jsonl"), "w").write("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        kept(dies, final)
    assert open(os.path.join(final, "records.jsonl")).read() == "first\n"
    assert os.listdir(tmp_path / "m") == ["c1"]  # the half-made run is gone
    kept(lambda out: open(os.path.join(out, "records.jsonl"), "w").write("second\n"), final)
    assert open(os.path.join(final, "records.jsonl")).read() == "second\n" and os.listdir(tmp_path / "m") == ["c1"]


def test_point_labels_are_readable_and_unique():
    from ckptbench.suite.parse import load_suite

    cases = load_suite(os.path.join(ROOT, "suites", "smoke.toml")).cases
    labels = point_labels(cases)
    assert sorted(labels.values()) == sorted(c.id for c in cases)
    assert "llama-tiny full b2 s64" in labels
    doubled = point_labels([cases[0], cases[0]])
    assert len(doubled) == 1 or all(cases[0].id in label for label in doubled)


def test_the_page_marks_flagged_commits_and_escapes_what_files_say(four_commits):
    results, commits, base = four_commits
    history = build_history(results)
    history.series[0].labels[base[0]["case_id"]] = "<script>x</script>"
    page = render(history)
    assert "<script>x" not in page and "&lt;script&gt;x" in page
    # per point, two lines, each with one mark: the peak at the third commit, the step time at the fourth
    assert page.count("<polyline") == 2 * len(base) and page.count("<circle") == 2 * len(base)


def test_cli_history_exit_status_and_bad_input(four_commits, tmp_path):
    results, commits, base = four_commits
    run = [sys.executable, "-m", "ckptbench", "history"]
    done = subprocess.run([*run, results, "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and json.loads(done.stdout)["series"][0]["commits"][2]["changes"]
    missing = subprocess.run([*run, str(tmp_path / "none")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr
    unwritable = subprocess.run([*run, results, "--html", str(tmp_path / "no" / "dir" / "h.html")],
                                capture_output=True, text=True, timeout=120)
    assert unwritable.returncode == 2 and "--html" in unwritable.stderr and "Traceback" not in unwritable.stderr


def test_asv_init_writes_a_conf_and_a_benchmark_and_keeps_what_is_there(tmp_path):
    suite = os.path.join(ROOT, "suites", "smoke.toml")
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "smoke.toml").write_text(open(suite).read())
    run = [sys.executable, "-m", "ckptbench", "asv", "init", "--dir", str(tmp_path), "--suite",
           str(tmp_path / "suites" / "smoke.toml")]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "suite_benchmark('suites/smoke.toml')" in (tmp_path / "benchmarks" / "training.py").read_text()
    assert '"benchmark_dir": "benchmarks"' in (tmp_path / "asv.conf.json").read_text()
    again = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout == "" and again.stderr.count("kept as it is") == 2
    bad = subprocess.run([*run[:-1], str(tmp_path / "nope.toml")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "nope.toml" in bad.stderr and "Traceback" not in bad.stderr


def test_step_benchmark_refuses_what_another_process_cannot_import():
    from ckptbench.history.benchmark import step_benchmark

    with pytest.raises(ValueError, match="top of an importable module"):
        step_benchmark(tiny=lambda: None)
    with pytest.raises(ValueError, match="not a count of processes"):
        step_benchmark(repeats=0, tiny=reference_records)
    with pytest.raises(ValueError, match="at least one step"):
        step_benchmark()
    cls = step_benchmark(repeats=1, tiny=lambda: None)  # in asv's own process: anything callable
    assert cls.params == [["tiny"]] and cls.track_peak_bytes.unit == "bytes"
    assert step_benchmark(tiny=reference_records).params == [["tiny"]]


def test_the_scale_figures_are_the_committed_ones():
    """scripts/history_scale.py's page at 1,000 commits × 50 points: its bytes (deterministic: seeded draws)
    and the 9 memory commits it must flag are what results/reference-history-scale/scale.json says; the
    seconds there are the script's clock, not asserted."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import history_scale

    with open(os.path.join(ROOT, "results", "reference-history-scale", "scale.json")) as fh:
        figures = json.load(fh)
    page, history = history_scale.page_of(figures["commits"], figures["points"])
    assert len(page.encode()) == figures["page_bytes"] < 20 * 10**6
    flagged = [c for c in history.series[0].commits if any(ch.quantity == "peak_bytes" for ch in c.changes)]
    assert len(flagged) == figures["memory_commits_flagged"] == 9
    assert all(ch.new - ch.old == 1024 for c in flagged for ch in c.changes if ch.quantity == "peak_bytes")


def test_a_benchmark_failed_on_the_newest_commit_fails_the_job_and_an_empty_directory_is_refused(four_commits, tmp_path):
    results, commits, base = four_commits
    for commit in commits[2:]:  # no regression left: the last two commits equal the first
        for path in (os.path.join(results, RECORDS_DIR, "m1", "env", commit),):
            shutil.rmtree(path)
    run = [sys.executable, "-m", "ckptbench", "history", results]
    quiet = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0, quiet.stderr
    newest = os.path.join(results, "box", f"{commits[3][:8]}-env.json")
    with open(newest, "w") as fh:  # asv says the newest commit's benchmark failed (its setup raised)
        json.dump({"commit_hash": commits[3], "env_name": "env", "date": 4_000, "version": 2,
                   "results": {"training.SuiteTraining.track_peak_bytes": [None, [["'p'"]]]}}, fh)
    failed = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "failed on the newest commit" in failed.stderr
    older = build_history(results)
    assert older.newest_failed and older.failed == older.newest_failed
    (tmp_path / "empty").mkdir()
    empty = subprocess.run([*run[:-1], str(tmp_path / "empty")], capture_output=True, text=True, timeout=120)
    assert empty.returncode == 2 and "no ckptbench records" in empty.stderr and empty.stderr.count("\n") == 1


def test_another_suites_records_at_a_commit_are_named_not_judged(tmp_path):
    records = reference_records(4)
    results = str(tmp_path)
    write_commit(results, "m", "e", "1" * 40, records[:2], 1)
    write_commit(results, "m", "e", "2" * 40, changed(records[2:], peak_delta=10**6), 2)
    first, second = build_history(results).series[0].commits
    assert second.changes == []
    assert "no point in common with the commit before" in " ".join(second.notes)
    assert sum(n.startswith("new point") for n in second.notes) == 2 and sum(
        n.startswith("point gone") for n in second.notes) == 2
