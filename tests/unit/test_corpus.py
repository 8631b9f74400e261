"""Text sources: what is read, in which order, what is held out, and the errors when it is not there."""

import json
import os
import sysconfig

import pytest

from ckptbench.point.case import DataSpec
from ckptbench.sources.corpus import (
    HELD_OUT_EVERY,
    SEPARATOR,
    CorpusError,
    check_available,
    read_corpus,
    split_documents,
    stdlib_files,
)


def test_stdlib_files_are_sorted_sources_without_tests_or_installed_packages():
    root = sysconfig.get_paths()["stdlib"]
    files = stdlib_files()
    rel = [os.path.relpath(f, root).replace(os.sep, "/") for f in files]
    assert rel == sorted(rel) and len(rel) > 100
    assert all(r.endswith(".py") for r in rel)
    assert not any(r.startswith("test/") or "/tests/" in r or "site-packages" in r for r in rel)
    assert "os.py" in rel and "json/decoder.py" in rel


def test_every_twentieth_document_is_held_out_and_never_trained_on():
    docs = [f"doc{i:03d}".encode() for i in range(45)]
    train, held = split_documents(docs, SEPARATOR)
    assert held.split(SEPARATOR) == [b"doc019", b"doc039"]
    assert len(train.split(SEPARATOR)) == 43
    assert not set(held.split(SEPARATOR)) & set(train.split(SEPARATOR))


def test_stdlib_corpus_is_the_same_text_twice():
    a, b = read_corpus(DataSpec(source="stdlib")), read_corpus(DataSpec(source="stdlib"))
    assert a.sha1 == b.sha1 and a.train == b.train
    assert a.documents == len(stdlib_files()) and a.held_out_documents == a.documents // HELD_OUT_EVERY
    assert max(a.train) < 256 and SEPARATOR not in a.train.split(SEPARATOR)[0]


def test_a_text_file_is_cut_into_pieces_without_separators(tmp_path):
    path = tmp_path / "notes.txt"
    text = bytes(range(32, 127)) * 100
    path.write_bytes(text)
    c = read_corpus(DataSpec(source="file", path=str(path)))
    assert c.documents == 100 and len(c.train) + len(c.held_out) == len(text)
    assert SEPARATOR not in c.train
    piece = len(text) // 100
    assert c.held_out[:piece] == text[19 * piece:20 * piece]


def test_missing_or_empty_files_are_named(tmp_path):
    with pytest.raises(CorpusError, match="is not a file") as exc:
        check_available(DataSpec(source="file", path=str(tmp_path / "nope.txt")))
    assert exc.value.key == "data.path"
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(CorpusError, match="is empty"):
        check_available(DataSpec(source="file", path=str(tmp_path / "empty.txt")))


def make_cached_dataset(cache: str, repo: str, rows: list[str]) -> None:
    """Leave in `cache` what ``datasets.load_dataset(repo)`` leaves after a download: the prepared arrow
    files of its default configuration, under ``<namespace>___<name>/default/0.0.0/<revision>``."""
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.json.json import Json

    os.makedirs(cache, exist_ok=True)
    src = os.path.join(cache, "src.jsonl")
    with open(src, "w") as fh:
        fh.writelines(json.dumps({"text": r, "id": i}) + "\n" for i, r in enumerate(rows))
    name = repo.split("/")[-1]
    builder = Json(cache_dir=os.path.join(cache, "build"), dataset_name=name, hash="0123abcd",
                   data_files=DataFilesDict.from_patterns({"train": [src]}))
    builder.download_and_prepare()
    os.renames(builder.cache_dir, os.path.join(cache, repo.replace("/", "___"), "default", "0.0.0", "0123abcd"))


def test_a_cached_dataset_is_read_offline(tmp_path, monkeypatch):
    cache = str(tmp_path / "hf-datasets")
    make_cached_dataset(cache, "tiny/stories", [f"story {i}: once upon a time" for i in range(60)])
    monkeypatch.setenv("HF_DATASETS_CACHE", cache)
    spec = DataSpec(source="dataset", name="tiny/stories")
    check_available(spec)
    c = read_corpus(spec)
    assert c.documents == 60 and c.held_out_documents == 3
    assert c.held_out.split(SEPARATOR)[0] == b"story 19: once upon a time"
    with pytest.raises(CorpusError, match="no column 'body'") as exc:
        check_available(DataSpec(source="dataset", name="tiny/stories", column="body"))
    assert exc.value.key == "data.column"


def test_a_dataset_never_loaded_here_is_a_clear_error_not_a_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))
    with pytest.raises(CorpusError, match="not in the datasets cache") as exc:
        check_available(DataSpec(source="dataset", name="nobody/nothing-here"))
    assert exc.value.key == "data.name" and str(tmp_path) in exc.value.reason
