"""A setting's step time, from a measured step of the same workload on the same machine, transformed.

A baseline is a point that ran: its median step and each decoder layer's forward, timed in place during
its timed steps (:mod:`ckptbench.measure.layertime`: CUDA events on a GPU, the wall clock on a CPU).  A
point of the same model and setup is predicted from baselines other than itself:

- **Same batch and sequence** (any strategy): a step is ``T₀ + r·c + o`` for c checkpointed layers, r
  what recomputing one layer costs and o offload's copies.  Where the target's c lies between the counts
  of the baselines at this shape (two or more different ones), T₀ and r are fitted to their steps (least
  squares): r is then measured whole, checkpoint's own bookkeeping included.  Beyond them (or with one
  count), the nearest count's steps plus r = each layer's forward as the baselines measured it
  (non-reentrant checkpoint stops recomputing after the last saved tensor, a few element-wise ops short
  of the whole forward).  Transformers' offload costs its copies at the link, on the compute stream
  (nothing overlaps them); streamed offload only what one layer's compute cannot hide of each layer's
  copies (out during the next layer's forward, back during the backward above, about two forwards); on a
  CPU nothing is copied (the host is the device).
- **Other batches or sequences**: each baseline brought back to no checkpointing as above, its step and
  its mean layer forward fitted over the measured (batch, seq) by a non-negative least-squares model in
  tokens plus attention's quadratic term (``a + c₁·b·s + c₂·b·s²``), then transformed to the target at
  its batch and sequence; only between measured shapes (three or more, around the target's tokens and
  sequence), never beyond them.

Nothing here times an operator alone or reads the point it predicts.  A selective-checkpointing (SAC)
point is predicted only from baselines of the same policy (what it recomputes is the policy's share of
the forward, which no plain baseline measured); a compiled or multi-rank point is not predicted.  Pure:
no torch import (the fit uses scipy).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from ...base.finite import finite_number
from ...point.case import Case
from .roofline import HOST_LINK_BYTES_PER_S


def group_key(case: Case) -> str:
    """What a baseline must share with the point it predicts: everything but the batch, the sequence and
    the strategy (which layers are checkpointed, how, and offload)."""
    d = case.to_dict()
    for key in ("batch_size", "seq_len", "every_n_layers", "offload", "recompute", "local_sgd_steps"):
        d.pop(key, None)
    train = dict(d.get("train") or {})
    d["train"] = {"threads": train.get("threads")}
    d.pop("data", None)
    return json.dumps(d, sort_keys=True)


def workload(case: Case) -> tuple:
    """What a point's step computes, beyond its :func:`group_key`: its batch and sequence, the layers it
    checkpoints and how, and its offload only where offload moves something (CUDA; on a CPU the host is
    the device and an offloaded step is the plain one).  Seed, data and local-SGD period are not in it."""
    r = case.recompute
    copies = case.device == "cuda"
    return (case.batch_size, case.seq_len, tuple(case.checkpointed_layers), r.sac, r.compile_budget,
            bool(case.offload) and copies, r.offload if copies and case.offload else "")


def twins(target: Case, base: Case) -> bool:
    """Whether `base` ran the very step `target` runs: then it is never a baseline of `target`, since a
    prediction from it would be the observation again (CPU offload beside plain; a seed or data variant)."""
    return workload(base) == workload(target)


@dataclass(frozen=True)
class Baseline:
    """A measured point, as the model uses it."""

    case: Case
    step_s: float
    forward_s: tuple[float, ...]  # each decoder layer's forward, median over the timed steps
    case_id: str
    group: str  # :func:`group_key` of its case: which points it may predict

    @classmethod
    def of(cls, record: dict) -> Baseline | None:
        """The baseline a record gives, or None (a failed point, no layer times, a compiled or multi-rank one)."""
        if record.get("status") != "ok":
            return None
        m = record.get("measurement") or {}
        times = (m.get("layer_times") or {}).get("forward_s")
        step = m.get("step_time_median_s")
        if not isinstance(times, list) or not times or not finite_number(step) or step <= 0:
            return None
        if not all(finite_number(t) and t >= 0 for t in times):
            return None
        try:
            case = Case.from_dict(record["case"])
        except Exception:  # a case that does not read back as one: never a baseline
            return None
        if case.compiled or case.world_size > 1 or len(times) != case.model.layers:
            return None
        return cls(case, float(step), tuple(float(t) for t in times), record.get("case_id", case.id), group_key(case))

    @property
    def shape(self) -> tuple[int, int]:
        return self.case.batch_size, self.case.seq_len


def layer_bytes(case: Case) -> int:
    """Bytes one checkpointed layer's offload moves each way: its input hidden states (b × s × h)."""
    return case.batch_size * case.seq_len * case.model.hidden * case.model.bytes_per_element


def added_s(case: Case, forward_s: tuple[float, ...] | list[float], link_bytes_per_s: float) -> tuple[float, float]:
    """(recompute seconds, offload seconds) that `case`'s strategy adds to its step without checkpointing,
    given each layer's forward at its batch and sequence."""
    layers = case.checkpointed_layers
    recompute = sum(forward_s[i] for i in layers if i < len(forward_s))
    if not case.offload or case.device != "cuda" or not layers:
        return recompute, 0.0
    copy = layer_bytes(case) / link_bytes_per_s
    if case.recompute.offload == "streamed":
        layer = statistics.mean(forward_s) if forward_s else 0.0
        return recompute, len(layers) * (max(0.0, copy - layer) + max(0.0, copy - 2 * layer))
    return recompute, 2 * copy * len(layers)


def transformable(case: Case) -> str:
    """Why `case` cannot be reached by transforming another strategy's step ("" when it can)."""
    if case.recompute.sac:
        return "a SAC point recomputes its policy's share of each forward, which no other strategy's step measured"
    return ""


def transformed(target: Case, same: list[Baseline], link_bytes_per_s: float) -> tuple[float, str]:
    """`target`'s step from baselines at its batch and sequence (see the module's text), and how r was had."""
    forward = [statistics.mean(t) for t in zip(*(b.forward_s for b in same))]  # each layer, over the baselines
    per_layer = statistics.mean(forward)
    # each baseline without its offload's copies, against how many layers it checkpoints
    points = [(len(b.case.checkpointed_layers), b.step_s - added_s(b.case, forward, link_bytes_per_s)[1])
              for b in same]
    counts = sorted({c for c, _ in points})
    wanted = len(target.checkpointed_layers)
    offload = added_s(target, forward, link_bytes_per_s)[1]
    if len(counts) >= 2 and counts[0] <= wanted <= counts[-1]:
        n = len(points)
        mc, mt = sum(c for c, _ in points) / n, sum(t for _, t in points) / n
        slope = sum((c - mc) * (t - mt) for c, t in points) / sum((c - mc) ** 2 for c, _ in points)
        if slope > 0:  # between steps that checkpoint fewer and more layers: r is theirs
            scale = slope / per_layer if per_layer > 0 else 1.0
            recompute = added_s(target, [f * scale for f in forward], link_bytes_per_s)[0]
            return mt - slope * mc + recompute + offload, "recompute fitted to the steps"
    # beyond the baselines' counts (or one count only): the nearest count's steps, each layer's measured forward
    near = min(counts, key=lambda c: (abs(c - wanted), c))
    plain = statistics.median(t - added_s(b.case, forward, link_bytes_per_s)[0]
                              for (c, t), b in zip(points, same) if c == near)
    return plain + added_s(target, forward, link_bytes_per_s)[0] + offload, "recompute = the layers' measured forward"


def _fit(points: list[tuple[int, int, float]]):
    """Non-negative least squares of y over (1, b·s, b·s²), rows weighted by 1/y (relative error); with two
    points, the two terms that tell them apart.  Returns a function of (b, s)."""
    import numpy as np
    from scipy.optimize import nnls

    def features(b: int, s: int) -> list[float]:
        return [1.0, float(b * s), float(b * s * s)]

    columns = [0, 1, 2]
    if len(points) == 2:
        (b1, s1, _), (b2, s2, _) = points
        columns = [1, 2] if s1 != s2 and b1 * s1 != b2 * s2 else [0, 1]
    a = np.array([[features(b, s)[c] / y for c in columns] for b, s, y in points])
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale, np.ones(len(points)))
    coef = coef / scale

    def f(b: int, s: int) -> float:
        x = features(b, s)
        return float(sum(coef[k] * x[c] for k, c in enumerate(columns)))

    return f


MIN_FIT_SHAPES = 3  # distinct (batch, seq) a fit needs around the target


def fitted(target: Case, bases: list[Baseline], link_bytes_per_s: float) -> float | None:
    """`target`'s step from baselines at :data:`MIN_FIT_SHAPES` or more other (batch, seq) around it (its
    tokens and its sequence within theirs): each brought back to no checkpointing, step and mean layer
    forward fitted over (b, s), transformed to the target.  None where they do not surround it."""
    by_shape: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for base in bases:
        plain = base.step_s - sum(added_s(base.case, base.forward_s, link_bytes_per_s))
        by_shape.setdefault(base.shape, []).append((plain, statistics.mean(base.forward_s)))
    if len(by_shape) < MIN_FIT_SHAPES:
        return None
    b, s = target.batch_size, target.seq_len
    tokens = [x * y for x, y in by_shape]
    seqs = [y for _, y in by_shape]
    if not (min(tokens) <= b * s <= max(tokens) and min(seqs) <= s <= max(seqs)):
        return None  # between measured shapes only: no extrapolation
    steps = [(b, s, statistics.median(p for p, _ in v)) for (b, s), v in by_shape.items()]
    layers = [(b, s, statistics.median(f for _, f in v)) for (b, s), v in by_shape.items()]
    if any(y <= 0 for *_, y in steps + layers):
        return None
    forward = [_fit(layers)(b, s)] * target.model.layers
    return _fit(steps)(b, s) + sum(added_s(target, forward, link_bytes_per_s))


def baselines(records: list[dict]) -> list[Baseline]:
    """The baselines `records` give (each read once: a caller predicting many points keeps this list)."""
    return [b for b in (Baseline.of(r) for r in records) if b is not None]


def predict(target: Case, records: list[dict], link_bytes_per_s: float | None = None) -> dict:
    """The step-time model's answer for `target` from `records` (points that ran): :func:`predict_from`."""
    return predict_from(target, baselines(records), link_bytes_per_s)


def predict_from(target: Case, measured: list[Baseline], link_bytes_per_s: float | None = None) -> dict:
    """The step-time model's answer for `target` from `measured` baselines (the target's own is never
    used, nor a twin's: :func:`twins`), as the record keeps it: ``predicted_s`` with its ``method`` and ``baselines``, or ``error``
    saying why there is none."""
    if target.compiled:
        return {"error": "a compiled point runs inductor's kernels: no eager baseline transforms into it"}
    if target.world_size > 1:
        return {"error": "a multi-rank point's step holds its collectives: not predicted from single-rank steps"}
    link = link_bytes_per_s or HOST_LINK_BYTES_PER_S
    link_note = "measured" if link_bytes_per_s else "assumed"
    key = group_key(target)
    bases = [b for b in measured if b.case_id != target.id and b.group == key and not twins(target, b.case)]
    why = transformable(target)
    if why:  # only its own policy's steps know what it recomputes
        bases = [b for b in bases if b.case.recompute == target.recompute and b.case.offload == target.offload
                 and b.case.every_n_layers == target.every_n_layers]
    else:
        bases = [b for b in bases if not transformable(b.case)]
    same = [b for b in bases if b.shape == (target.batch_size, target.seq_len)]
    out = {"link_bytes_per_s": link, "link": link_note if target.offload and target.device == "cuda" else None}
    if same:
        value, how = transformed(target, same, link)
        return {**out, "predicted_s": value, "method": "transformed", "recompute": how,
                "baselines": [b.case_id for b in same], "baseline_strategies": [b.case.strategy for b in same],
                "source": f"measured steps of {', '.join(sorted({b.case.strategy for b in same}))} at the same batch "
                          f"and sequence, transformed ({how})"}
    value = fitted(target, bases, link)
    if value is not None:
        shapes = sorted({b.shape for b in bases})
        return {**out, "predicted_s": value, "method": "fitted", "baselines": [b.case_id for b in bases],
                "source": f"fitted over {len(shapes)} measured (batch, seq): "
                          + ", ".join(f"{b}x{s}" for b, s in shapes)}
    need = f" ({why})" if why else ""
    return {**out, "error": "no measured baseline of this model and setup at this batch and sequence, nor "
                            f"{MIN_FIT_SHAPES} others around it{need}"}
