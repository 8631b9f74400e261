"""transformers' answers kept on disk (ckptbench.sources.answers): asked once, reused only for the same question,
versions and code, and a stored file is data that may be anything."""

from __future__ import annotations

import json
import os

import pytest

from ckptbench.sources import answers, configs
from ckptbench.sources.configs import ConfigError


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.setenv(answers.ENV, str(tmp_path / "answers"))
    return tmp_path / "answers"


def counting(answer):
    calls = []

    def ask():
        calls.append(1)
        return answer

    return ask, calls


def test_an_answer_is_asked_once_and_then_read(here):
    ask, calls = counting({"known": True})
    assert answers.remembered(["q", "1"], ask) == {"known": True}
    assert answers.remembered(["q", "1"], ask) == {"known": True}
    assert len(calls) == 1 and len(list(here.iterdir())) == 1
    other, other_calls = counting({"known": False})
    assert answers.remembered(["q", "2"], other) == {"known": False} and len(other_calls) == 1


def test_a_failed_ask_is_not_kept(here):
    ask, calls = counting(None)
    assert answers.remembered(["q"], ask) is None and answers.remembered(["q"], ask) is None
    assert len(calls) == 2 and not here.exists()


def test_the_key_follows_the_versions_and_the_code(here, monkeypatch):
    before = answers.key(["q"])
    monkeypatch.setattr(answers, "_version", lambda dist: "9.9.9")
    assert answers.key(["q"]) != before
    monkeypatch.undo()
    monkeypatch.setattr(answers, "code_digest", lambda: "edited")
    assert answers.key(["q"]) != before


@pytest.mark.parametrize("content", [
    "not json", "[1, 2]", '{"key": "someone else", "answer": {"known": false}}', '{"answer": {"known": false}}',
    "[" * 5000 + "]" * 5000, "\udcff".encode("utf-8", "surrogatepass").decode("latin-1"),
])
def test_a_stored_file_that_is_not_this_answer_is_asked_again_and_replaced(here, content):
    ask, calls = counting({"known": True})
    k = answers.key(["q"])
    here.mkdir()
    (here / f"{k}.json").write_text(content, encoding="latin-1")
    assert answers.remembered(["q"], ask) == {"known": True} and len(calls) == 1
    assert json.loads((here / f"{k}.json").read_text())["answer"] == {"known": True}


def test_off_keeps_and_reads_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(answers.ENV, "off")
    ask, calls = counting({"known": True})
    answers.remembered(["q"], ask)
    answers.remembered(["q"], ask)
    assert len(calls) == 2 and answers.cache_dir() is None


def test_a_folder_that_cannot_be_written_only_means_asking_again(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(answers.ENV, str(blocker / "answers"))  # under a file: cannot be created
    ask, calls = counting({"known": True})
    assert answers.remembered(["q"], ask) == {"known": True}
    assert answers.remembered(["q"], ask) == {"known": True} and len(calls) == 2


def test_the_model_class_child_is_asked_once_across_commands(here):
    configs.model_class.cache_clear()
    first = configs.model_class("mistral")
    [path] = here.iterdir()
    stored = json.loads(path.read_text())
    assert stored["question"] == ["ckptbench.sources.configs", "model-class", "mistral"]
    assert stored["answer"]["known"] is True and first.supports_sdpa is True
    configs.model_class.cache_clear()  # a new command: read from the folder, equal to what the child said
    assert configs.model_class("mistral") == first
    configs.model_class.cache_clear()


def test_a_kept_model_class_answer_of_the_wrong_shape_is_a_one_line_error(here):
    configs.model_class.cache_clear()
    k = answers.key(["ckptbench.sources.configs", "model-class", "mistral"])
    here.mkdir()
    (here / f"{k}.json").write_text(json.dumps({"key": k, "answer": {"known": "yes", "evil": 1}}))
    with pytest.raises(ConfigError, match="not a model-class answer"):
        configs.model_class("mistral")
    configs.model_class.cache_clear()
    assert os.path.exists(here / f"{k}.json")
