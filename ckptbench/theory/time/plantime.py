"""The step time of a plan's candidates: priced from traces of few-layer steps, carried to any depth and batch.

A plan asks for the step time of every strategy at its largest batch, on models up to 80 layers deep.
Tracing each full step would cost seconds per candidate; the step's ops make that unnecessary:

- **Depth.** Every decoder layer runs the same ops, and every checkpointed layer recomputes the same
  ones, so a step's time is affine in the layer count L and the checkpointed layers c:
  ``T(L, c) = T(1, 0) + (L − 1)·(T(2, 0) − T(1, 0)) + c·(T(1, 1) − T(1, 0))``, where ``T(1, 1)`` is one
  checkpointed layer with the candidate's offload.  Models of up to :data:`DIRECT_LAYERS` layers are
  priced whole.
- **Batch** (datasheet pricing only).  At a fixed sequence length every call's FLOPs and bytes are affine
  in the batch (each tensor has a batch dimension or none), so the calls of the step at batch 2 and 3,
  matched one to one, give every call's FLOPs and bytes at any batch; each is priced as
  :func:`.roofline.entry_seconds` prices it.  (Batch 1 runs two cheap ops fewer, an ``expand`` and a
  ``clone`` of one layer's keys, that torch skips for a single sequence: priced from 2 and 3, it keeps
  them.)  Measured rates are per shape and need the real batch's trace.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from ...point.case import Case
from ...point.strategy import Recompute
from .roofline import Rates, datasheet_rates, entry_seconds

DIRECT_LAYERS = 2


def _few_layer(case: Case) -> tuple[Case, Case, Case]:
    """One plain layer, two plain layers, and one layer checkpointed as each of `case`'s checkpointed layers
    is: its SAC policy and its offload.  The plain steps checkpoint nothing (no layer set: its indices are
    the deep model's; no policy).  The offload kind is left out: either offload's trace files the same
    copies, and :func:`streamed_hidden_s` tells them apart."""
    one = replace(case, model=replace(case.model, layers=1), every_n_layers=0, offload=False, recompute=Recompute())
    two = replace(one, model=replace(case.model, layers=2))
    checkpointed = replace(one, every_n_layers=1, offload=case.offload, recompute=Recompute(sac=case.recompute.sac))
    return one, two, checkpointed


def variants(case: Case) -> list[tuple[Case, int]]:
    """The few-layer Cases whose step times, so weighted, sum to `case`'s (itself when it is shallow)."""
    layers, c = case.model.layers, len(case.checkpointed_layers)
    if layers <= DIRECT_LAYERS:
        return [(case, 1)]
    one, two, checkpointed = _few_layer(case)
    out = [(one, 2 - layers - c), (two, layers - 1)]
    if c:  # one checkpointed layer, as each of the c recomputes
        out.append((checkpointed, c))
    return out


def streamed_hidden_s(case: Case, price) -> float:
    """Seconds of streamed offload's copies that compute hides (0 for any other Case).

    The trace files every offload copy on the compute stream, as transformers' offload runs them.  Streamed
    offload runs them on a side stream: a checkpointed layer's input leaves while the layers above run their
    forward and comes back (prefetched) while the layer above runs its backward.  The model: each
    checkpointed layer's copies overlap one layer's compute, so of its copies' serial time (one checkpointed
    layer with offload less without) at most one plain layer's time (two layers less one) is hidden.  An
    assumption, not yet measured on a GPU; on a CPU nothing is copied and nothing is hidden."""
    c = len(case.checkpointed_layers)
    if not (case.offload and case.recompute.offload == "streamed" and case.device == "cuda" and c):
        return 0.0
    one, two, checkpointed = _few_layer(case)
    copies = price(checkpointed) - price(replace(checkpointed, offload=False))
    layer = price(two) - price(one)
    return c * max(0.0, min(copies, layer))


def depth_extrapolated(case: Case, price) -> float:
    """`case`'s step time from `price` (seconds of a shallow Case) of :func:`variants`, less what streamed
    offload's copies overlap (:func:`streamed_hidden_s`)."""
    return sum(weight * price(v) for v, weight in variants(case)) - streamed_hidden_s(case, price)


@functools.lru_cache(maxsize=256)
def _recorded(case: Case) -> tuple[dict, tuple, tuple]:
    """(entries, every call's key in order, every call's phase) of `case`'s traced step."""
    from .optrace import record_case

    recorder = record_case(case, sequence=True)
    return recorder.entries, tuple(recorder.calls), tuple(recorder.call_phases)


def _affine_calls(case: Case) -> list[dict] | None:
    """Every call of `case`'s step with its FLOPs and bytes at its batch, from the steps at batch 2 and 3;
    None when the two do not run the same ops in the same order."""
    e1, calls1, phases = _recorded(replace(case, batch_size=2))
    e2, calls2, _ = _recorded(replace(case, batch_size=3))
    if len(calls1) != len(calls2) or any(e1[a]["op"] != e2[b]["op"] for a, b in zip(calls1, calls2)):
        return None
    b = case.batch_size - 2
    return [{"key": None, "kind": e1[x]["kind"], "phase": p,
             "flops": e1[x]["flops"] + b * (e2[y]["flops"] - e1[x]["flops"]),
             "bytes": e1[x]["bytes"] + b * (e2[y]["bytes"] - e1[x]["bytes"])}
            for x, y, p in zip(calls1, calls2, phases)]


def step_calls(case: Case) -> list[dict]:
    """Every call of a shallow `case`'s step, in order, with its kind, phase, FLOPs and bytes."""
    calls = _affine_calls(case)
    if calls is None:
        entries, order, phases = _recorded(case)
        calls = [{**entries[k], "phase": p} for k, p in zip(order, phases)]
    return calls


def priced(case: Case, rates: Rates) -> float:
    """Seconds of a shallow `case`'s step at `rates` (no timed entries: every call modelled)."""
    return sum(entry_seconds(c, rates) for c in step_calls(case))


class DatasheetTimer:
    """A plan's step times on a card that is not here: every op at the datasheet's rates (a measured matmul
    rate and link bandwidth replace the datasheet's where a calibration gives them)."""

    def __init__(self, device_name: str | None, link_bytes_per_s: float | None = None,
                 matmul_flops_per_s: float | None = None):
        self.device_name, self.link, self.matmul = device_name, link_bytes_per_s, matmul_flops_per_s
        self.source = ""  # no step priced yet (none is where nothing fits)

    def rates(self, case: Case) -> Rates | None:
        rates = datasheet_rates(self.device_name, case.compute_dtype, self.link, self.matmul)
        self.source = rates.source if rates is not None else "unknown: the card is not in the datasheet tables"
        return rates

    @functools.lru_cache(maxsize=4096)  # noqa: B019 (one timer per plan: the cache dies with it)
    def price(self, case: Case) -> float | None:
        rates = self.rates(case)
        return None if rates is None else priced(case, rates)

    def __call__(self, case: Case) -> float | None:
        if self.rates(case) is None:
            return None
        return depth_extrapolated(case, self.price)
