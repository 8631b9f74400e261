"""What a tracked record is judged against: the sweep's checks of its Case, with what the user's run has
beyond the sweep's step.

- One rank of a DDP run: the one-process step of the same setting plus DDP's gradient buckets
  (:mod:`ckptbench.theory.verdicts.ddp`); the sweep's multi-rank points are judged on their collectives instead.
- A batch with an ``attention_mask``: the simulated step with a mask padding as many tokens as the memory
  step's did (transformers' sdpa builds a 4-D mask from one that pads; a Case is unpadded, the sweep's
  point of it has no mask).
- A loop holding the model's output through the backward (:mod:`.held`).
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import torch

from ..point.case import Case
from ..run.worker import simulated_estimate
from ..theory.verdicts.annotate import annotate_record
from ..theory.verdicts.checks import verdict
from ..theory.verdicts.ddp import bucket_bytes, ddp_rank_checks, written_buckets
from .held import held_note, judge_with_held_output


def judge_run(case: Case, measurement: dict, model, held: int, padded: int | None) -> None:
    """Add to `measurement` (in place) what its record is judged with beyond the sweep's: a DDP rank's
    buckets, a simulation of the step as the run had it (one rank's own step, the memory step's mask), the
    output the loop held.  A Case with no analytic estimate was simulated with its mask already
    (:func:`~ckptbench.run.worker.measurement_of`)."""
    alone = replace(case, world_size=1, local_sgd_steps=0)  # what a rank's own step is judged as
    ddp = case.world_size > 1 and isinstance(model, torch.nn.parallel.DistributedDataParallel)
    if ddp:
        measurement["ddp_bucket_bytes"] = bucket_bytes(model)
    if (ddp and not alone.analytic and not measurement.get("simulation")) or ((padded or held) and alone.analytic):
        # multi-rank: not simulated; analytic: no mask, no moment to add a held output to
        measurement.pop("simulation_error", None)
        measurement.update(simulated_estimate(alone, padded))
    if padded is not None:
        measurement["batch_padded_tokens"] = padded
    if held:
        judge_with_held_output(alone, measurement, held)


def padded_note(padded: int) -> str:
    return (f"the memory step's attention_mask pads {padded:,} tokens: judged against the simulated step with "
            "such a mask (transformers builds a 4-D mask from it; the Case, and the sweep's point of it, are "
            "unpadded)")


def annotate(case: Case, record: dict) -> None:
    """The sweep's checks, as the module's text says."""
    measurement = record.get("measurement") or {}
    if case.world_size > 1 and case.setup.sharding == "ddp":
        annotate_record(replace(case, world_size=1, local_sgd_steps=0), record,
                        by_simulation=bool(measurement.get("batch_padded_tokens")))
        buckets = measurement.get("ddp_bucket_bytes")
        if buckets is None:
            return
        written = written_buckets(case, buckets)  # none under LocalSGD: its steps run under no_sync
        ddp_rank_checks(record, written)
        record["checked_as"] = ("one rank's own step: the one-process estimate of the same setting plus DDP's "
                                f"gradient buckets ({written:,} B), counted from the backward's first write")
        if record["status"] == "ok":
            record["verdict"] = verdict([SimpleNamespace(verdict=c["verdict"]) for c in record["checks"]],
                                        record.get("gates") or {})
            if record.get("estimate_source") == "none" and record["verdict"] == "pass":
                record["verdict"] = "unchecked"  # nothing predicted the memory: never a pass (as the sweep's)
        return
    held, padded = measurement.get("loop_held_output_bytes"), measurement.get("batch_padded_tokens")
    annotate_record(case, record, by_simulation=bool(held or padded))
    notes = [held_note(held)] if held else []
    notes += [padded_note(padded)] if padded else []
    if notes:
        record["estimate_note"] = "; ".join(notes)
