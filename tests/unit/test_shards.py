"""Shard locks: live sweeps of one directory never share a point; what each runs is on disk."""

from __future__ import annotations

import os

import pytest

from ckptbench.base.errors import UsageError
from ckptbench.run.shards import SweepLock, overlapping, shard_states


def planned(shard: tuple[int, int], n_cases: int) -> set[int]:
    i, n = shard
    return {k for k in range(n_cases) if k % n == i - 1}  # the sweep's own rule (run.sweep.plan)


@pytest.mark.parametrize("n_cases", [1, 2, 5, 12])
def test_overlap_is_exactly_sharing_a_planned_point(n_cases):
    shards = [(i, n) for n in range(1, 7) for i in range(1, n + 1)]
    for a in shards:
        for b in shards:
            assert overlapping(a, b, n_cases) == bool(planned(a, n_cases) & planned(b, n_cases)), (a, b)


def test_disjoint_shards_share_a_directory_and_overlapping_ones_are_refused(tmp_path):
    out = str(tmp_path)
    with SweepLock(out, (1, 2), n_cases=6):  # points 0, 2, 4
        with SweepLock(out, (2, 4), n_cases=6):  # points 1, 5: none of them 1/2's
            with pytest.raises(UsageError, match="is running shard 2/4 into"):
                SweepLock(out, (2, 2), n_cases=6).__enter__()  # 1, 3, 5
        with pytest.raises(UsageError, match=rf"another sweep \(pid {os.getpid()}\) is running shard 1/2 into "
                                             rf"{out}, which shares points with shard 1/1"):
            SweepLock(out, (1, 1), n_cases=6).__enter__()
        with pytest.raises(UsageError, match="shard 1/2 into .*, which shares points with shard 1/4"):
            SweepLock(out, (1, 4), n_cases=6).__enter__()  # 0, 4
        with pytest.raises(UsageError, match="is running shard 1/2 into"):
            SweepLock(out, (1, 2), n_cases=6).__enter__()
    with SweepLock(out, (1, 1), n_cases=6):  # once they ended, the whole suite may run
        pass


def test_state_says_who_runs_what_while_the_lock_is_held(tmp_path):
    out = str(tmp_path)
    with SweepLock(out, (2, 3), n_cases=9, job="77_1") as lock:
        lock.running([{"case_id": "abc", "repeat": 0, "slots": [1], "where": "cores 0"}])
        (state,) = shard_states(out)
        assert state.shard == (2, 3) and state.held
        assert state.info["pid"] == os.getpid() and state.info["job"] == "77_1"
        assert [p["case_id"] for p in state.info["running"]] == ["abc"]
    (state,) = shard_states(out)
    assert not state.held and state.info["running"] == [] and "ended_at" in state.info


def test_a_sweep_that_dies_leaves_its_points_in_flight_on_disk(tmp_path):
    out = str(tmp_path)
    lock = SweepLock(out, (1, 1), n_cases=3)
    lock.__enter__()
    lock.running([{"case_id": "abc", "repeat": 0}])
    os.close(lock.fd)  # what the kernel does when the process dies: the lock goes, nothing else runs
    (state,) = shard_states(out)
    assert not state.held and state.info["running"] == [{"case_id": "abc", "repeat": 0}]
    with SweepLock(out, (1, 1), n_cases=3):  # and nothing refuses the next sweep
        pass
