"""What kernels reach on a card: the achieved fractions of its datasheet rates, fitted on a CUDA run's steps.

The roofline (:mod:`.roofline`) prices every traced call at the card's datasheet peak: a lower bound, since
no kernel reaches it.  Here each call of the traced step is split into what bounds it at the datasheet
rates (its FLOPs at the matmul peak for a matmul or attention call whose FLOPs outweigh its bytes, else its
bytes at the memory bandwidth), a kernel launch, or a host↔device copy, and a step's time is modelled as

    T = compute_s / f_compute + memory_s / f_memory + kernels × s_kernel + copy_s / f_copy

with the four figures fitted (non-negative least squares on the relative error) on measured steps of one
card.  f_compute and f_memory are fractions of that card's datasheet rates; carried to another card they
apply to its datasheet rates (the transfer by datasheet ratios), exact only within a card class (Hopper:
H100, H200).  s_kernel is the host's time per kernel (dispatch and launch), which does not scale with the
card.  The interval is the spread of held-out ratios (measured / predicted, each shape of the run
predicted by the fit on the other shapes): an empirical 5–95 % band of one run, not a guarantee.

Pure over the traces: the calls come from :mod:`.plantime`'s few-layer traces (FakeTensor), so a fit and
a prediction run on any CPU machine.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

from ...point.case import Case
from ..comm.overlap import LayerCompute
from .roofline import Rates, datasheet_rates

FIGURES = ("compute_s", "memory_s", "kernels", "copy_s")
PHASES = ("forward", "recompute", "backward", "optimizer")
# card classes by device-name substring, first match wins: fractions carry within a class
CLASSES: tuple[tuple[str, str], ...] = (("H200", "Hopper"), ("H100", "Hopper"), ("H800", "Hopper"),
                                        ("A100", "Ampere"), ("A800", "Ampere"), ("L40S", "Ada"),
                                        ("RTX 4090", "Ada"))


def card_class(device_name: str | None) -> str | None:
    for key, name in CLASSES:
        if device_name and key.lower() in device_name.lower():
            return name
    return None


def call_figures(call: dict, rates: Rates) -> tuple[float, float, float, float]:
    """(compute s, memory s, kernels, copy s) of one traced call at the datasheet `rates`."""
    kind = call["kind"]
    if kind == "view":
        return 0.0, 0.0, 0.0, 0.0
    if kind == "copy":
        return 0.0, 0.0, 0.0, call["bytes"] / rates.link_bytes_per_s
    flop_s = call["flops"] / rates.matmul_flops_per_s if kind in ("matmul", "attention") else 0.0
    byte_s = call["bytes"] / rates.bandwidth_bytes_per_s
    return (flop_s, 0.0, 1.0, 0.0) if flop_s >= byte_s else (0.0, byte_s, 1.0, 0.0)


def _shallow_figures(case: Case, rates: Rates) -> dict[str, tuple[float, ...]]:
    from .plantime import step_calls

    out = {p: [0.0] * len(FIGURES) for p in PHASES}
    for call in step_calls(case):
        figures = call_figures(call, rates)
        row = out[call["phase"]]
        for i, f in enumerate(figures):
            row[i] += f
    return {p: tuple(v) for p, v in out.items()}


@functools.lru_cache(maxsize=2048)
def _cached(case: Case, device_name: str, link: float | None) -> dict[str, tuple[float, ...]]:
    rates = datasheet_rates(device_name, case.compute_dtype, link)
    return _shallow_figures(case, rates)


def step_figures(case: Case, device_name: str, link_bytes_per_s: float | None = None) -> dict[str, tuple]:
    """Per phase, the four figures of `case`'s step on `device_name` (its datasheet rates, copies at
    `link_bytes_per_s`), carried to the model's depth as :func:`.plantime.variants` carries a step."""
    from .plantime import variants

    total = {p: [0.0] * len(FIGURES) for p in PHASES}
    for v, weight in variants(case):
        for p, row in _cached(v, device_name, link_bytes_per_s).items():
            for i, f in enumerate(row):
                total[p][i] += weight * f
    return {p: tuple(v) for p, v in total.items()}


@dataclass(frozen=True)
class Achieved:
    """The fitted figures of one card's run, and what they were fitted on."""

    card: str  # the device name the run measured
    f_compute: float  # achieved share of the datasheet matmul peak
    f_memory: float  # achieved share of the datasheet memory bandwidth
    s_kernel: float  # the card's seconds per kernel beyond its FLOPs and bytes (launch, tails)
    f_copy: float  # achieved share of the calibrated host link
    s_host: float  # the host's seconds per kernel (dispatch): a step is never faster than its kernels' dispatch
    low: float  # held-out ratio measured / predicted, 5th percentile
    high: float  # and 95th
    points: int
    source: str  # the run's records
    held_out: str  # how the interval was made

    @property
    def card_class(self) -> str | None:
        return card_class(self.card)

    def coefficients(self) -> tuple[float, ...]:
        return (1 / self.f_compute if self.f_compute else 0.0, 1 / self.f_memory if self.f_memory else 0.0,
                self.s_kernel, 1 / self.f_copy if self.f_copy else 0.0, self.s_host)

    def seconds(self, figures: tuple[float, ...]) -> float:
        """The step (or phase) these figures describe: the card's time, or its kernels' dispatch if longer."""
        return predict_with(self.coefficients(), figures)

    def to_dict(self) -> dict:
        return asdict(self)


def fit(rows: list[tuple[tuple[float, ...], float]]) -> tuple[float, ...]:
    """Coefficients (1/f_compute, 1/f_memory, GPU s a kernel, 1/f_copy, host s a kernel) minimising the
    squared log error of ``max(card time, host time)`` over (figures, measured seconds) rows; each fraction
    at most 1 (no kernel beats its datasheet rate).  Starts from the linear fit of the card's time alone."""
    import numpy as np
    from scipy.optimize import least_squares, nnls

    a = np.array([figures for figures, _ in rows], dtype=float)
    t = np.array([s for _, s in rows], dtype=float)
    used = a.any(axis=0)  # a figure no row has (no copies) is left out
    x0 = np.zeros(len(FIGURES))
    x0[used] = nnls(a[:, used] / t[:, None], np.ones(len(rows)))[0]
    lower = np.array([1.0, 1.0, 0.0, 1.0])
    x0 = np.clip(np.maximum(x0, lower), lower, None)

    def predicted(x):
        return np.maximum((a[:, used] * x[:-1][used]).sum(axis=1), a[:, 2] * x[-1])

    start = np.append(x0, float(np.median(t / np.maximum(a[:, 2], 1))))
    lo = np.append(lower, 0.0)
    hi = np.array([100.0, 100.0, 1e-3, 100.0, 1e-3])
    fitted = least_squares(lambda x: np.log(predicted(x)) - np.log(t), np.clip(start, lo, hi), bounds=(lo, hi))
    x = fitted.x
    x[:-1][~used] = 0.0
    return tuple(float(v) for v in x)


def predict_with(x: tuple[float, ...], figures: tuple[float, ...]) -> float:
    """``max(card time, host time)`` of a step's figures under fitted coefficients `x`."""
    card = sum(c * f for c, f in zip(x[:-1], figures))
    return max(card, figures[2] * x[-1])


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` by linear interpolation between order statistics."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def held_out_ratios(rows: list[tuple[tuple[float, ...], float]], groups: list) -> list[float]:
    """measured / predicted of every row, each predicted by the fit on the rows of the other groups."""
    ratios = [0.0] * len(rows)
    for g in dict.fromkeys(groups):
        train = [r for r, h in zip(rows, groups) if h != g]
        x = fit(train)
        for i, (r, h) in enumerate(zip(rows, groups)):
            if h == g:
                ratios[i] = r[1] / predict_with(x, r[0])
    return ratios


def achieved_from(cases: list[Case], seconds: list[float], device_name: str, link: float | None,
                  source: str) -> tuple[Achieved, list[dict]]:
    """The fit on every point, its interval from the points of each (batch, sequence) shape predicted by
    the fit on the other shapes, and a row per point (in-sample and held-out predictions)."""
    rows = [(tuple(map(sum, zip(*step_figures(c, device_name, link).values()))), t) for c, t in zip(cases, seconds)]
    groups = [(c.batch_size, c.seq_len) for c in cases]
    x = fit(rows)
    ratios = held_out_ratios(rows, groups)
    a = Achieved(device_name, 1 / x[0] if x[0] else 0.0, 1 / x[1] if x[1] else 0.0, x[2],
                 1 / x[3] if x[3] else 0.0, x[4], quantile(ratios, 0.05), quantile(ratios, 0.95), len(rows), source,
                 "each (batch, sequence) shape predicted by the fit on the other shapes")
    table = [{"case": c, "measured_s": t, "in_sample_s": a.seconds(r), "held_out_s": t / q}
             for c, (r, t), q in zip(cases, rows, ratios)]
    return a, table


def layer_compute(case: Case, phase_seconds) -> LayerCompute:
    """`case`'s compute per micro-batch by layer (:class:`..comm.overlap.LayerCompute`) from `phase_seconds`
    (a shallow Case -> seconds per phase) of :func:`.plantime.variants`' one- and two-layer steps."""
    from .plantime import DIRECT_LAYERS, _few_layer

    ckpt = tuple(case.checkpointed_layers)
    if case.model.layers <= DIRECT_LAYERS:  # priced whole: every layer alike, the head left in them
        p = phase_seconds(case)
        L = case.model.layers
        return LayerCompute(L, p["forward"] / L, p["backward"] / L,
                            p["recompute"] / len(ckpt) if ckpt else 0.0, ckpt, optimizer=p["optimizer"])
    one, two, checkpointed = _few_layer(case)
    p1, p2 = phase_seconds(one), phase_seconds(two)
    fwd, bwd = p2["forward"] - p1["forward"], p2["backward"] - p1["backward"]
    recompute = 0.0
    if ckpt:
        pc = phase_seconds(checkpointed)
        recompute = pc["backward"] + pc["recompute"] - p1["backward"]
    optimizer = p1["optimizer"] + (case.model.layers - 1) * (p2["optimizer"] - p1["optimizer"])
    return LayerCompute(case.model.layers, fwd, bwd, recompute, ckpt, head_fwd=max(0.0, p1["forward"] - fwd),
                        head_bwd=max(0.0, p1["backward"] - bwd), optimizer=optimizer)


class AchievedTimer:
    """A plan's expected step times on a card that is not here: the traced step's calls at the card's
    datasheet rates, divided by the achieved fractions a CUDA run measured (:class:`Achieved`), with that
    run's held-out interval."""

    def __init__(self, device_name: str, fitted: Achieved, link_bytes_per_s: float | None = None):
        self.device_name, self.fitted, self.link = device_name, fitted, link_bytes_per_s
        same = card_class(device_name) == fitted.card_class and card_class(device_name) is not None
        carried = (f"{fitted.card}'s" if fitted.card.lower() in device_name.lower() else
                   f"{fitted.card_class} fractions from the {fitted.card}, carried to the {device_name} by datasheet "
                   "ratios" if same else
                   f"no measurement of the {card_class(device_name) or 'unknown'} class exists: the "
                   f"{fitted.card}'s fractions ({fitted.card_class}) carried by datasheet ratios, the interval not "
                   "validated for this class")
        self.source = (f"expected (x{fitted.low:.2f}-x{fitted.high:.2f}, the 5-95 % of held-out ratios): the traced "
                       f"step at {fitted.f_compute:.0%} of the matmul peak, {fitted.f_memory:.0%} of the memory "
                       f"bandwidth, {fitted.s_kernel * 1e6:.1f} us a kernel ({carried}; fitted on {fitted.points} "
                       f"points of {fitted.source})")
        self.interval = (fitted.low, fitted.high)

    def _phases(self, case: Case) -> dict[str, float]:
        return {p: self.fitted.seconds(f) for p, f in _cached(case, self.device_name, self.link).items()}

    def price(self, case: Case) -> float:
        return sum(self._phases(case).values())

    def __call__(self, case: Case) -> float | None:
        from .plantime import depth_extrapolated

        if datasheet_rates(self.device_name, case.compute_dtype) is None:
            return None
        return depth_extrapolated(case, self.price)

    def compute(self, case: Case):
        return layer_compute(case, self._phases)
