"""The suite's [data] table and seed axis: what they expand to, and one-line errors for what cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ckptbench.point.case import Case, DataSpec
from ckptbench.suite.keys import SuiteError
from ckptbench.suite.parse import load_suite, parse_suite

SWEEP = "[sweep]\nbatch_size = [2]\nseq_len = [32]\nworld_size = [2]\nlocal_sgd_steps = [0, 4]\n"
MODEL = '[model]\npreset = "llama-tiny"\n'


def text(data: str = "", sweep: str = SWEEP, model: str = MODEL) -> str:
    return model + sweep + (f"[data]\n{data}\n" if data else "")


def test_without_data_points_train_on_random_tokens_and_keep_their_ids():
    s = parse_suite(text(), "x.toml")
    assert all(c.data == DataSpec() for c in s.cases)
    ref = os.path.join(os.path.dirname(__file__), "..", "..", "results", "reference-localsgd-cpu")
    with open(os.path.join(ref, "records.jsonl")) as fh:
        recorded = {json.loads(line)["case_id"] for line in fh}
    assert {c.id for c in load_suite(os.path.join(ref, "suite.toml")).cases} == recorded


def test_a_text_source_is_part_of_the_point():
    s = parse_suite(text('source = "stdlib"\neval_every = 10\neval_batches = 8'), "x.toml")
    assert {c.data for c in s.cases} == {DataSpec(source="stdlib", eval_every=10, eval_batches=8)}
    random_ids = {c.id for c in parse_suite(text(), "x.toml").cases}
    assert not random_ids & {c.id for c in s.cases}
    assert all(Case.from_dict(c.to_dict()) == c for c in s.cases)


def test_seed_axis_crosses_every_point():
    s = parse_suite(text(sweep=SWEEP + "seed = [0, 1, 2]\n"), "x.toml")
    assert [(c.local_sgd_steps, c.train.seed) for c in s.cases] == [(0, 0), (4, 0), (0, 1), (4, 1), (0, 2), (4, 2)]
    assert len({c.id for c in s.cases}) == 6
    # without the axis, train.seed is the one seed, and the ids are those a seed-less suite always had
    plain = parse_suite(text(), "x.toml")
    assert [c.id for c in parse_suite(text(sweep=SWEEP + "seed = [0]\n"), "x.toml").cases] == [c.id for c in plain.cases]


def test_a_file_path_is_resolved_beside_the_suite(tmp_path):
    (tmp_path / "corpus.txt").write_text("some text " * 100)
    suite = tmp_path / "s.toml"
    suite.write_text(text('source = "file"\npath = "corpus.txt"'))
    s = load_suite(str(suite))
    assert s.cases[0].data.path == str(tmp_path / "corpus.txt")


@pytest.mark.parametrize("data, sweep, model, key, message", [
    ('source = "wiki"', SWEEP, MODEL, "data.source", "unknown source 'wiki'"),
    ('source = "stdlib"\npath = "x.txt"', SWEEP, MODEL, "data.path", "means nothing for source 'stdlib'"),
    ('source = "file"', SWEEP, MODEL, "data.path", "missing"),
    ('source = "dataset"', SWEEP, MODEL, "data.name", "missing"),
    ('eval_every = 5', SWEEP, MODEL, "data.eval_every", "means nothing for source 'random'"),
    ('source = "stdlib"\neval_batches = 0', SWEEP, MODEL, "data.eval_batches", "must be > 0"),
    ('source = "stdlib"', SWEEP, MODEL + "vocab = 128\n", "model.vocab", "byte-level"),
    ('source = "stdlib"', SWEEP.replace("world_size = [2]", "world_size = [1, 2]"), MODEL, "data.source",
     "world_size > 1"),
    ('source = "stdlib"\nseed = 1', SWEEP, MODEL, "data.seed", "unknown key"),
])
def test_data_mistakes_name_the_key(data, sweep, model, key, message):
    with pytest.raises(SuiteError) as exc:
        parse_suite(text(data, sweep, model), "bad.toml")
    assert exc.value.key == key and message in exc.value.reason


def test_a_corpus_missing_here_stops_the_sweep_before_it_starts(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(text('source = "dataset"\nname = "nobody/nothing-here"'))
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", str(path), "--dry-run"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: data.name: dataset nobody/nothing-here is not in")


def test_the_quality_suite_is_300_steps_of_text_over_k_and_seeds():
    s = load_suite("suites/localsgd-quality.toml")
    assert {c.train.warmup_steps + c.train.steps for c in s.cases} == {300}
    assert sorted({c.local_sgd_steps for c in s.cases}) == [0, 4, 16, 64]
    assert sorted({c.train.seed for c in s.cases}) == [0, 1, 2]
    assert {c.world_size for c in s.cases} == {2} and {c.data.source for c in s.cases} == {"stdlib"}


@pytest.mark.parametrize("train, sweep, key, message", [
    ("threads = 100000", SWEEP, "train.threads", "at most 1,024"),
    ("seed = 4294967296", SWEEP, "train.seed", "at most 4,294,967,295"),
    ("steps = 1000000", SWEEP, "train.steps", "at most 100,000"),
    ("", SWEEP + "seed = [0, 4294967296]\n", "sweep.seed", "at most 4,294,967,295"),
])
def test_train_settings_no_run_could_use_name_the_key(train, sweep, key, message):
    with pytest.raises(SuiteError) as exc:
        parse_suite(MODEL + sweep + f"[train]\n{train}\n", "bad.toml")
    assert exc.value.key == key and message in exc.value.reason
    parse_suite(MODEL + SWEEP + "[train]\nthreads = 1024\nseed = 4294967295\n", "ok.toml")
