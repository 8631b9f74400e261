"""Text a point can learn from, offline: the bytes of a corpus, split once into training and held-out text.

Local SGD trades quality for communication, and quality is only visible on data with something to
learn.  Three sources exist on a machine without a download:

* ``stdlib``: the ``.py`` files of the running Python's standard library (about 800 files, 12 MB on
  3.11), in sorted path order, without the ``test``/``tests``/``idle_test`` packages and
  ``site-packages``.  Every machine with this Python has the same text.
* ``file``: a user's text file, cut into 100 equal pieces.
* ``dataset``: the ``column`` of a split of a Hugging Face ``datasets`` cache entry, read with the hub
  switched off: a dataset that was never loaded on this machine is a clear error, never a download.

Documents (files, pieces, rows) are held out deterministically: every ``HELD_OUT_EVERY``-th one (index
19, 39, …) goes to the evaluation split, the rest to training, so the held-out text is spread over the
whole corpus and never overlaps the training text.  Multi-document sources join documents with a NUL
byte, which Python source and ordinary text never contain, so the model sees where a document ends.

Torch-free: the suite validator asks :func:`check_available` before any worker starts.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass

from ..point.case import DataSpec

HELD_OUT_EVERY = 20  # document i is held out when i % 20 == 19: 5 % of the documents
FILE_PIECES = 100  # a single text file is cut into this many documents
SEPARATOR = b"\0"
MAX_CORPUS_BYTES = 64 * 2**20  # a large dataset is read up to this many bytes, in its own row order
SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "tests", "idle_test"})


class CorpusError(ValueError):
    """A corpus that cannot be read here: the suite key at fault and the reason, with what to do."""

    def __init__(self, key: str, reason: str):
        self.key, self.reason = key, reason
        super().__init__(f"{key}: {reason}")


@dataclass(frozen=True)
class Corpus:
    """The training and held-out text of a source, and what a record needs to say which text it was."""

    train: bytes
    held_out: bytes
    documents: int
    held_out_documents: int
    description: str
    sha1: str  # of both splits: two records with equal hashes trained and evaluated on the same text

    def summary(self) -> dict:
        return {"description": self.description, "documents": self.documents,
                "held_out_documents": self.held_out_documents, "train_bytes": len(self.train),
                "held_out_bytes": len(self.held_out), "sha1": self.sha1}


def stdlib_files() -> list[str]:
    """The standard library's ``.py`` files, sorted by their path below the library's root."""
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for here, dirs, files in os.walk(root):
        top = os.path.relpath(here, root) == "."
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not (top and d == "test"))
        found += [os.path.join(here, f) for f in files if f.endswith(".py")]
    return sorted(found, key=lambda p: os.path.relpath(p, root).replace(os.sep, "/"))


def _stdlib_documents() -> tuple[list[bytes], str]:
    docs = []
    for path in stdlib_files():
        with open(path, "rb") as fh:
            docs.append(fh.read())
    version = ".".join(str(v) for v in sys.version_info[:3])
    return docs, f"Python {version} standard library: {len(docs)} .py files"


def _file_documents(path: str) -> tuple[list[bytes], str]:
    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_CORPUS_BYTES)
    except OSError as exc:
        raise CorpusError("data.path", f"cannot read {path}: {exc.strerror or exc}") from None
    if not text:
        raise CorpusError("data.path", f"{path} is empty")
    cuts = [len(text) * i // FILE_PIECES for i in range(FILE_PIECES + 1)]
    return [text[a:b] for a, b in zip(cuts, cuts[1:])], f"{os.path.basename(path)}: {len(text)} bytes"


def load_cached_dataset(spec: DataSpec):
    """The split of `spec`'s dataset from the ``datasets`` cache (``HF_DATASETS_CACHE`` when set), hub off."""
    try:
        import datasets
    except ImportError:
        raise CorpusError("data.source", "'dataset' needs the datasets package (pip install datasets)") from None
    datasets.config.HF_HUB_OFFLINE = True  # the cache or nothing: a benchmark never downloads a corpus
    datasets.utils.logging.set_verbosity_error()
    what = spec.name + (f" ({spec.config})" if spec.config else "")
    try:
        ds = datasets.load_dataset(spec.name, spec.config or None, split=spec.split,
                                   cache_dir=os.environ.get("HF_DATASETS_CACHE") or None)
    except ConnectionError:
        raise CorpusError("data.name", f"dataset {what} is not in the datasets cache "
                          f"({os.environ.get('HF_DATASETS_CACHE') or datasets.config.HF_DATASETS_CACHE}); "
                          f"load it once where the hub is reachable: datasets.load_dataset({spec.name!r})") from None
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise CorpusError("data", f"dataset {what}, split {spec.split!r}: {str(exc).splitlines()[0]}") from None
    if spec.column not in ds.column_names:
        raise CorpusError("data.column", f"dataset {what} has no column {spec.column!r}; "
                          f"it has {', '.join(ds.column_names)}")
    return ds


def _dataset_documents(spec: DataSpec) -> tuple[list[bytes], str]:
    ds = load_cached_dataset(spec)
    docs: list[bytes] = []
    total = 0
    for start in range(0, ds.num_rows, 1000):  # in row order, a slice at a time, up to MAX_CORPUS_BYTES
        for value in ds[start:start + 1000][spec.column]:
            docs.append(str(value).encode("utf-8"))
            total += len(docs[-1])
        if total >= MAX_CORPUS_BYTES:
            break
    config = f":{spec.config}" if spec.config else ""
    return docs, f"{spec.name}{config} [{spec.split}].{spec.column}: {len(docs)} rows"


def split_documents(docs: list[bytes], separator: bytes) -> tuple[bytes, bytes]:
    """(training text, held-out text): every HELD_OUT_EVERY-th document is held out."""
    held = [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    kept = [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    return separator.join(kept), separator.join(held)


def read_corpus(spec: DataSpec) -> Corpus:
    """The corpus `spec` names, split; CorpusError (one line, naming the key) when it cannot be read."""
    if spec.source == "stdlib":
        docs, description = _stdlib_documents()
    elif spec.source == "file":
        docs, description = _file_documents(spec.path)
    elif spec.source == "dataset":
        docs, description = _dataset_documents(spec)
    else:
        raise CorpusError("data.source", f"{spec.source!r} is not a text corpus")
    train, held = split_documents(docs, b"" if spec.source == "file" else SEPARATOR)
    digest = hashlib.sha1(train + b"\n--held-out--\n" + held).hexdigest()
    return Corpus(train, held, len(docs), len(docs) // HELD_OUT_EVERY, description, digest)


def check_available(spec: DataSpec) -> None:
    """Fail now, not in a worker, when the corpus is not on this machine (cheap: nothing is tokenised)."""
    if spec.source == "file":
        if not os.path.isfile(spec.path):
            raise CorpusError("data.path", f"{spec.path} is not a file")
        if not os.access(spec.path, os.R_OK):
            raise CorpusError("data.path", f"{spec.path} is not readable")
        if os.path.getsize(spec.path) == 0:
            raise CorpusError("data.path", f"{spec.path} is empty")
    elif spec.source == "dataset":
        load_cached_dataset(spec)
    elif spec.source == "stdlib" and not stdlib_files():
        raise CorpusError("data.source", f"this Python has no standard library sources under "
                          f"{sysconfig.get_paths()['stdlib']}")
