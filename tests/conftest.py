"""Shared fixtures: tiny suites written on the fly, and the GPU skip.

transformers' answers about a model (:mod:`ckptbench.answers`) are kept for the test session in a folder
of the system's temporary directory, never in the user's own cache; the key holds the code's hash, so an
answer kept by another checkout or an older commit is never reused.
"""

from __future__ import annotations

import os
import tempfile
import textwrap

import pytest

os.environ.setdefault("CKPTBENCH_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"ckptbench-test-answers-{os.getuid()}"))


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)


TINY_SUITE = """
[suite]
name = "tiny"
timeout_s = 120

[model]
preset = "llama-tiny"

[train]
warmup_steps = 1
memory_steps = 1
steps = 2
time_precision = 0.1  # tiny steps on a shared machine vary by 20 % or more: a loose precision, a small cap
max_steps = 8

[sweep]
batch_size = [2]
seq_len = [32]
every_n_layers = [0, 1]
"""


@pytest.fixture
def write_suite(tmp_path):
    """Write a suite file (TOML text) into tmp_path and return its path."""

    def write(text: str = TINY_SUITE, name: str = "suite.toml") -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return str(path)

    return write
