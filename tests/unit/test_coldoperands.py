"""A CPU matmul is timed with its operands other than the first matrix from beyond the caches."""

from __future__ import annotations

import pytest
import torch

from ckptbench.measure import coldoperands, oprates
from ckptbench.measure.optrace import OpRecorder


@pytest.fixture
def small_pool(monkeypatch):
    """A 1 MiB pool, made afresh for the test (the process's own is twice the last-level cache)."""
    monkeypatch.setattr(coldoperands, "cold_pool_bytes", lambda: 2**20)
    monkeypatch.setattr(coldoperands, "_POOLS", {})
    monkeypatch.setattr(coldoperands, "_CURSOR", {})


def _entry(fn, op: str) -> dict:
    recorder = OpRecorder()
    with recorder:
        fn()
    return next(e for e in recorder.trace() if e["op"].startswith(op))


def _calls(entry: dict, n: int):
    func, call = oprates.entry_call(entry, "cpu")
    return call, coldoperands.cold_operand_calls(func, call.args, call.keywords, n)


def test_the_other_operands_take_the_pool_s_next_places_call_after_call_and_the_first_matrix_stays(small_pool):
    mm = _entry(lambda: torch.ones(64, 32) @ torch.ones(32, 16), "aten.mm.default")
    call, calls = _calls(mm, 5)
    pool = coldoperands._POOLS[torch.float32]
    assert pool.numel() == 2**20 // 4 and len(calls) == 5
    per = 32 * 16
    for j, c in enumerate(calls):
        first, other = c.args
        assert first is call.args[0]  # the activation: as made, where the op before left it
        assert other.shape == (32, 16) and other.stride() == (16, 1)
        assert other.data_ptr() == pool.data_ptr() + j * per * 4  # the next place each call
        assert torch.equal(c(), first @ pool[j * per:(j + 1) * per].view(32, 16))
    _, more = _calls(mm, 3)  # the next entry's calls go on where these ended
    assert more[0].args[1].data_ptr() == pool.data_ptr() + 5 * per * 4
    _, wrapped = _calls(mm, pool.numel() // per)  # no room left for all of them: from the start again
    assert wrapped[0].args[1].data_ptr() == pool.data_ptr()
    assert len(wrapped) == pool.numel() // per and coldoperands._CURSOR[torch.float32] == pool.numel()


def test_a_linear_s_weight_and_bias_move_its_input_stays(small_pool):
    x, w, b = torch.ones(8, 32), torch.ones(16, 32), torch.ones(16)
    addmm = _entry(lambda: torch.nn.functional.linear(x, w, b), "aten.addmm.default")
    call, calls = _calls(addmm, 4)
    bias, first, weight = calls[1].args
    assert first is call.args[1] and bias is not call.args[0] and weight is not call.args[2]
    pool = coldoperands._POOLS[torch.float32]
    per = 16 + 32 * 16  # the bias, then the weight (transposed: its strides as the step had them)
    assert bias.data_ptr() == pool.data_ptr() + per * 4
    assert weight.data_ptr() == pool.data_ptr() + (per + 16) * 4 and weight.stride() == (1, 32)


def test_nothing_moves_where_the_operands_are_too_large_for_two_sets_or_not_floats(small_pool):
    big = _entry(lambda: torch.ones(4, 512) @ torch.ones(512, 512), "aten.mm.default")  # 1 MiB: half the pool
    assert _calls(big, 8)[1] is None
    ints = _entry(lambda: torch.ones(4, 8, dtype=torch.int64) @ torch.ones(8, 4, dtype=torch.int64),
                  "aten.mm.default")
    assert _calls(ints, 8)[1] is None
    assert not coldoperands._CURSOR


def test_time_entry_times_a_cpu_matmul_on_moved_operands_and_an_in_place_op_where_it_is(small_pool):
    mm = _entry(lambda: torch.ones(64, 32) @ torch.ones(32, 16), "aten.mm.default")
    assert oprates.time_entry(mm) > 0 and coldoperands._CURSOR[torch.float32] > 0
    cursor = coldoperands._CURSOR[torch.float32]
    t = torch.ones(64, 32)
    mul_ = _entry(lambda: t.mul_(torch.ones(32)), "aten.mul_.")
    assert oprates.time_entry(mul_) > 0 and coldoperands._CURSOR[torch.float32] == cursor


def test_the_last_level_cache_is_the_largest_size_the_kernel_lists_and_odd_files_are_passed_over(tmp_path):
    for name, text in (("index0", "32K\n"), ("index2", "1024K\n"), ("index3", "32768K\n"), ("index4", "huge\n"),
                       ("index5", "9" * 40)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "size").write_text(text)
    (tmp_path / "index6").mkdir()  # no size at all
    (tmp_path / "index7").mkdir()
    (tmp_path / "index7" / "size").write_bytes(b"\xff\xfe")
    assert coldoperands.last_level_cache_bytes(str(tmp_path)) == 32 * 2**20
    assert coldoperands.last_level_cache_bytes(str(tmp_path / "missing")) is None
    (tmp_path / "empty").mkdir()
    assert coldoperands.last_level_cache_bytes(str(tmp_path / "empty")) is None
