"""The sample of a grid that `make test` keeps: every value of every axis, the rest left to `make test-all`."""

from __future__ import annotations

import itertools

from tests.conftest import covering


def _kept(params):
    return [p.values for p in params if not p.marks]


def test_the_kept_points_hold_every_value_of_every_axis_and_the_rest_are_slow():
    grid = list(itertools.product(["llama", "qwen2", "gpt2"], ["fp32", "bf16-mixed"], ["manual", "trainer", "accelerate"],
                                  [0, 1, 2], [False, True]))
    params = covering(grid)
    kept = _kept(params)
    assert len(params) == len(grid) and 3 <= len(kept) < len(grid)
    for axis in range(5):
        assert {row[axis] for row in kept} == {row[axis] for row in grid}
    assert all([m.name for m in p.marks] == ["slow"] for p in params if p.marks)
    assert _kept(covering(grid)) == kept  # the same sample every time: a test's tier never changes by chance


def test_one_argument_tuples_stay_whole_and_keep_names_the_points_kept():
    grid = [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    params = covering(grid, unpack=False)
    assert [p.values for p in params] == [(g,) for g in grid]  # one argument, the tuple itself
    assert _kept(params) == [(("a", 1),), (("b", 2),)]  # two points hold a, b, 1 and 2
    assert _kept(covering(grid, keep={2})) == [("a", 2)]
