"""Shared fixtures: tiny suites written on the fly, the GPU skip, and the two tiers of the suite.

``make test`` runs every test not marked ``slow``; ``make test-all`` (what CI runs) runs them all.  A test
is ``slow`` when it takes ten seconds or more on two cores and what it checks is also checked, at its own
level, by a test that stays (see docs/troubleshooting.md, "The test suite"); a grid of end-to-end points
keeps a sample that holds every value of every axis (:func:`covering`) and leaves the rest of the grid slow.

transformers' answers about a model (:mod:`ckptbench.sources.answers`) are kept for the test session in a folder
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


slow = pytest.mark.slow


def covering(grid, keep=None, unpack: bool = True) -> list:
    """`grid` as pytest params: a few points that between them hold every value of every axis run in
    ``make test``, the rest are marked ``slow``.  Greedy and deterministic: each pick covers the most
    values not yet held (the earlier point on a tie).  `keep`: the indices to run instead, where one axis
    alone would keep the whole grid.  `unpack`: each point is the parametrize call's several arguments
    (else one argument, a tuple, whose items are the axes)."""
    rows = [p if isinstance(p, tuple) else (p,) for p in grid]
    if keep is None:
        values = [{(i, repr(v)) for i, v in enumerate(r)} for r in rows]  # (axis, value) pairs of each point
        keep = set()
        uncovered = set().union(*values)
        while uncovered:
            k = max(range(len(rows)), key=lambda k: (len(values[k] & uncovered), -k))
            keep.add(k)
            uncovered -= values[k]
    out = []
    for k, (point, row) in enumerate(zip(grid, rows)):
        args = row if unpack else (point,)
        out.append(pytest.param(*args) if k in keep else pytest.param(*args, marks=slow))
    return out


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
def fresh_accelerate():
    """Accelerate keeps its state per process: a test using it starts from none, as a script or the
    sweep's worker does, and leaves none (nor a changed torch thread count) to the next."""
    import torch
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    threads = torch.get_num_threads()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    torch.set_num_threads(threads)


@pytest.fixture
def write_suite(tmp_path):
    """Write a suite file (TOML text) into tmp_path and return its path."""

    def write(text: str = TINY_SUITE, name: str = "suite.toml") -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return str(path)

    return write
