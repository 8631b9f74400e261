"""What DDP adds to one rank's step, beside the one-process step of the same setting: its gradient buckets.

``DistributedDataParallel`` (``gradient_as_bucket_view`` off, its default) allocates flat buckets holding a
copy of every trainable parameter's gradient when it is built, before any step; in backward each
gradient is copied into its bucket and the bucket is all-reduced.  The exact tracker sees a bucket's
storage when the backward first writes it (a ``copy_`` into it) and counts it from then on, as
activations; the allocator meter never sees it (it was allocated before the step).  So a rank's step is the
one-process step plus, from the first gradient on, up to ``bucket_bytes`` = the trainable parameters'
bytes: all of it once every bucket has been written (llama-tiny fits one bucket: peak + 723,200 B exactly,
examples/torchrun_plain.py), less where the peak falls before the last bucket's first write.

:func:`ddp_rank_checks` judges a tracked rank that way: the peak (and its activations) between the
one-process estimate and it plus every bucket, difference stated against the full-bucket figure; the
meters with the buckets as the allocator's blind spot (``−bucket_bytes ≤ allocator − tracker``).
"""

from __future__ import annotations

from dataclasses import replace

from ...point.case import Case
from .checks import Check
from .meters import agreement, meter_checks

BUCKETED = ("peak_bytes", "peak_breakdown.activations")


def bucket_bytes(model) -> int:
    """Bytes of DDP's gradient buckets: one element per trainable parameter element, in its dtype."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _bucketed(c: dict, buckets: int) -> dict:
    est, measured = c["estimated"], c["measured"]
    slack = (c.get("tolerance") or 0.0) * est
    ok = est - slack <= measured <= est + buckets + slack
    return {**c, "estimated": est + buckets, "difference": measured - est - buckets,
            "ratio": measured / (est + buckets) if est + buckets else None,
            "verdict": "pass" if ok else "fail"}


def _meters(c: dict, buckets: int) -> dict:
    allowance = (c.get("tolerance") or 0.0) * (c["estimated"] or 0)
    diff = c["difference"]
    ok = diff is not None and -buckets <= diff <= allowance
    return {**c, "verdict": "pass" if ok else "fail"}


def written_buckets(case: Case, buckets: int) -> int:
    """The bucket bytes a rank's backward writes: all of them where DDP all-reduces gradients in backward
    (``local_sgd_steps == 0``); none under local SGD, whose steps run under DDP's ``no_sync``."""
    return buckets if case.local_sgd_steps == 0 else 0


def ddp_meter_checks(case: Case, m: dict) -> list[Check]:
    """A sweep's DDP rank: its two meters as a one-process step's (:func:`.meters.meter_checks`), with the
    buckets the backward writes as the allocator's blind spot."""
    buckets = written_buckets(case, m.get("ddp_bucket_bytes") or 0)
    return [Check(**_meters(c.to_dict(), buckets)) if c.verdict != "skip" else c
            for c in meter_checks(replace(case, world_size=1, local_sgd_steps=0), m)]


def ddp_rank_checks(record: dict, buckets: int) -> None:
    """Re-judge a DDP rank's record that was checked against the one-process estimate (see the module)."""
    record["checks"] = [_bucketed(c, buckets) if c["quantity"] in BUCKETED and c["verdict"] != "skip"
                        and isinstance(c["measured"], int) and isinstance(c["estimated"], int) else c
                        for c in record.get("checks", [])]
    meters = record.get("meters")
    if meters and meters.get("checks"):
        meters["checks"] = [_meters(c, buckets) if c["quantity"] == "allocator_vs_tracker_bytes"
                            and c["verdict"] != "skip" else c for c in meters["checks"]]
        meters["agreement"] = agreement([Check(**c) for c in meters["checks"]])
        record.setdefault("gates", {})["meters_disagree"] = int(meters["agreement"] == "disagree")
