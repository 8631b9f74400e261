"""The live-storage tracker counts storages resized in place (what FSDP2 does to unsharded parameters)."""

import torch

from ckptbench.measure.storage import LiveStorageTracker


def test_resize_in_place_is_counted_both_ways():
    t = torch.zeros(1000)  # 4,000 bytes, made before the tracker starts
    tr = LiveStorageTracker()
    tr.track(t, "params")
    tr.reset_peak()
    with tr:
        t.untyped_storage().resize_(0)
        assert tr.total == 0 and tr.by_category["params"] == 0
        t.untyped_storage().resize_(4000)
        assert tr.total == tr.peak == 4000
    assert torch.UntypedStorage.resize_ is not None and tr._resize_original is None


def test_a_storage_first_seen_growing_takes_the_resize_category():
    t = torch.zeros(10)
    t.untyped_storage().resize_(0)
    tr = LiveStorageTracker()
    tr.resize_category = "params"
    with tr:
        t.untyped_storage().resize_(40)
        assert tr.by_category["params"] == 40
    del t
    assert tr.total == 0  # freed: the finalizer removes what resize_ added


def test_resize_outside_the_tracker_is_not_seen():
    original = torch.UntypedStorage.resize_
    tr = LiveStorageTracker()
    with tr:
        pass
    assert torch.UntypedStorage.resize_ is original
    torch.zeros(4).untyped_storage().resize_(0)
    assert tr.total == 0
