"""What transformers answers about a model, kept on disk so the next command does not ask again.

A suite naming a model type without an analytic estimate asks a child interpreter which causal-LM class
transformers has for it, and whether transformers would build the config as asked (:mod:`.configs`): a
sweep's parent never imports torch, and each child imports torch and transformers, several seconds each
time.  The answers depend only on the question, the installed transformers and torch, and this package's
own code, so they are kept under ``$CKPTBENCH_CACHE_DIR`` (default ``$XDG_CACHE_HOME/ckptbench/answers``,
i.e. ``~/.cache/ckptbench/answers``) and reused when all four are the same.

- the key hashes the question, the versions of transformers and torch (read from their installed
  metadata, nothing imported) and the bytes of every ``.py`` file of this package, so an upgrade or an
  edit of the code that answers asks afresh;
- only a whole answer is kept (the child exited 0 and printed a JSON object); a timeout or a crash is
  asked again next time;
- a stored file is data, never code: it must parse as JSON, hold this key and an object as its answer,
  or it is ignored and asked again (and replaced).  Files are written to a temporary name and renamed, so
  a reader never sees half of one;
- ``CKPTBENCH_CACHE_DIR=off`` keeps nothing and reads nothing; a directory that cannot be written only
  means the next command asks again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import tempfile
from collections.abc import Callable
from importlib import metadata

ENV = "CKPTBENCH_CACHE_DIR"
MAX_BYTES = 1 << 20  # an answer is a few hundred bytes; anything larger is not one of ours


def cache_dir() -> str | None:
    """Where ckptbench keeps its answers, or None when keeping is off: ``$CKPTBENCH_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/ckptbench/answers``."""
    value = os.environ.get(ENV)
    if value is not None:
        if value.strip().lower() in ("", "off", "0", "no"):
            return None
        return value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ckptbench", "answers")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def code_digest() -> str:
    """Hash of every ``.py`` file of this package (all of ckptbench, not only this folder), in path order:
    what the children run."""
    root = pathlib.Path(__file__).parents[1]
    h = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def key(question: list[str]) -> str:
    """The key of `question` with this installation: question, transformers, torch, this package's code."""
    facts = [question, _version("transformers"), _version("torch"), code_digest()]
    return hashlib.sha1(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _read(path: str, wanted: str) -> dict | None:
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("key") != wanted or not isinstance(data.get("answer"), dict):
        return None
    return data["answer"]


def _write(directory: str, path: str, data: dict) -> None:
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".answer-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # not kept: the next command asks again


def remembered(question: list[str], ask: Callable[[], dict | None]) -> dict | None:
    """The kept answer to `question`, else ``ask()``'s, kept when it is a whole answer (a dict; None is
    an answer not to keep)."""
    directory = cache_dir()
    if directory is None:
        return ask()
    k = key(question)
    path = os.path.join(directory, f"{k}.json")
    found = _read(path, k)
    if found is not None:
        return found
    answer = ask()
    if isinstance(answer, dict):
        _write(directory, path, {"key": k, "question": question, "answer": answer})
    return answer
