"""A deep model's simulated step, from the simulated steps of the same model with two to four layers.

Decoder layers of one model are identical, so every moment of a training step holds an amount of memory
that is a sum of per-layer pieces: what each layer below the current one keeps saved (a checkpointed
layer its input, a plain layer everything its ops saved), the parameters, gradients and optimizer state
of L layers, and what the layer now running holds on top.  Each moment the simulation names
(``forward-layer-i``, ``forward-head``, ``backward-layer-i``, ``optimizer``, ...) is therefore an affine
function of a few features:

- a layer's moments: ``1, L, i, C(i)`` (C(i): checkpointed layers below i), with separate coefficients
  for a checkpointed and a plain layer i;
- the other moments: ``1, L, N`` (N: checkpointed layers in all);

each multiplied out by ``1, b`` (every activation is linear in the batch) and by ``1, s, s²`` when the
fit spans several sequence lengths (attention's score matrices are the only s² terms).  The counted
FLOPs of the step are fitted on ``1, L, N`` the same way.

The coefficients are solved from simulations of 3- and 5-layer models under every distinct
``every_n_layers`` pattern and two 4-layer steps (twelve steps, more equations than unknowns), and the
fit must reproduce every simulated moment to the byte, or :class:`NotAffine` says which moment did not.
A stack of unlike layers (Gemma's sliding and global attention, SmolLM3's layers without rotary
embeddings) is refused with its layer pattern: its first layers, which the copies are, need not hold
every kind, and a 4-layer check that follows the pattern cannot tell (:mod:`.stacks`).  The peak of an L-layer
step is then the largest predicted moment.  ``tests/unit/test_extrapolate.py`` shows the extrapolation
equal to the full simulation, byte for byte, on CPU.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ...point.case import ModelSpec
from ...point.setup import Setup
from ...point.strategy import Recompute, checkpointed_layers
from ...sources.configs import error_line
from .stacks import layer_kinds, pattern

FIT_LAYERS = (3, 5)
# Two depths fix any function of the depth; a third checks that it is affine: a 4-layer step, plain and
# every second layer checkpointed, must come out of the fit to the byte as well.
CHECK_LAYERS, CHECK_EVERY = 4, (0, 2)
SEQ_FACTORS = (0.5, 1.0, 2.0, 4.0)  # of the asked sequence length, for the fit across lengths


class NotAffine(Exception):
    """The simulated moments do not follow the per-layer model: extrapolating would be a guess."""


class SimulationFailed(Exception):
    """A few-layer simulation raised: its one-argument form crosses a process pool, where the original
    (a config class's validation error, say) might not unpickle and would break the pool instead."""


def patterns(layers: int) -> list[tuple[int, tuple[int, ...]]]:
    """(every_n_layers, checkpointed layers) for no checkpointing and each distinct every_n pattern."""
    out, seen = [(0, ())], set()
    for n in range(1, layers + 1):
        chosen = tuple(checkpointed_layers(layers, n))
        if chosen not in seen:
            seen.add(chosen)
            out.append((n, chosen))
    return out


def _layer_moment(name: str) -> tuple[str, int] | None:
    for kind in ("forward-layer-", "backward-layer-"):
        if name.startswith(kind):
            return kind[:-1], int(name[len(kind):])
    return None


def _features(name: str, layers: int, chosen: frozenset, batch: int, seq: int, s_degree: int
              ) -> tuple[str, np.ndarray]:
    """(coefficient key, feature row) of one moment of an L-layer step.

    The bottom layer (its input is the embedding's output) and the top one (its moment runs on into the
    final norm) are not like the others, so each has its own coefficients, and whether they are
    checkpointed is a feature of every moment.
    """
    first, top = int(0 in chosen), int(layers - 1 in chosen)
    layer = _layer_moment(name)
    if layer is None:
        key, base = name, [1, layers, len(chosen), first, top]
    else:
        kind, i = layer
        where = "bottom" if i == 0 else "top" if i == layers - 1 else "middle"
        key = f"{kind}:{'checkpointed' if i in chosen else 'plain'}:{where}"
        base = [1, layers, i, sum(1 for j in chosen if j < i), first]
    powers = [float(seq) ** k for k in range(s_degree + 1)]
    return key, np.array([f * bb * p for f, bb, p in itertools.product(base, (1, batch), powers)], dtype=float)


def _moments(layers: int) -> list[str]:
    names = ["forward", "forward-head", "backward-head", "backward-embedding", "optimizer"]
    for i in range(layers):
        names += [f"forward-layer-{i}", f"backward-layer-{i}"]
    return names


@dataclass
class Observation:
    layers: int
    chosen: frozenset
    batch: int
    seq: int
    moment_traces: dict  # moment -> device total after each allocation
    hardware_flops: int | None  # None where FLOPs were not counted
    params_bytes: int | None = None


@dataclass
class LayerFit:
    """Coefficients per moment kind, solved from few-layer simulations of one model and one offload."""

    s_degree: int
    coefficients: dict = field(default_factory=dict)  # key -> np.ndarray
    spans: dict = field(default_factory=dict)  # key -> (column scale, orthonormal basis of the fitted rows)

    def _predict(self, key: str, row: np.ndarray) -> int | None:
        coef = self.coefficients.get(key)
        if coef is None:
            return None
        # the fitted rows determine the prediction only for a row in their span; elsewhere the answer
        # would depend on which of many equally good solutions lstsq picked
        scale, basis = self.spans[key]
        scaled = row / scale
        if np.linalg.norm(scaled - (scaled @ basis.T) @ basis) > 1e-7 * np.linalg.norm(scaled):
            raise NotAffine(f"the few-layer simulations do not determine moment {key} here "
                            f"(features {row.tolist()} outside what was simulated)")
        return int(np.rint(row @ coef).max())

    def moments(self, layers: int, chosen, batch: int, seq: int) -> dict[str, int]:
        """Every moment's predicted device total for an L-layer step."""
        chosen, out = frozenset(chosen), {}
        for name in _moments(layers):
            key, row = _features(name, layers, chosen, batch, seq, self.s_degree)
            value = self._predict(key, row)
            if value is not None:
                out[name] = value
        return out

    def peak(self, layers: int, chosen, batch: int, seq: int) -> tuple[int, str]:
        """(predicted peak, the moment it is reached)."""
        moments = self.moments(layers, chosen, batch, seq)
        name = max(moments, key=moments.get)
        return moments[name], name

    def params(self, layers: int) -> int:
        # constant in batch and length: any row of the fitted kind answers (batch 2, s-powers of 1)
        key, row = _features("params", layers, frozenset(), 2, 1, self.s_degree)
        return self._predict(key, row)

    def hardware_flops(self, layers: int, chosen, batch: int, seq: int) -> int:
        key, row = _features("flops", layers, frozenset(chosen), batch, seq, self.s_degree)
        return self._predict(key, row)


def _solve(key: str, entries: list[tuple[np.ndarray, list[int], str]], out: LayerFit) -> None:
    """Coefficients for one key, one column per point of its moment's trace, checked to the byte."""
    a = np.array([r for r, _, _ in entries])
    y = np.array([v for _, v, _ in entries], dtype=float)
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1
    coef, *_ = np.linalg.lstsq(a / scale, y, rcond=None)
    coef = coef / scale[:, None]
    got = np.rint(a @ coef)
    # bytes are held to the byte; FLOP counts (10^14 and more at long sequences) to float64's own rounding
    # of the solve, a few units in 10^15, which no step time can tell apart
    slack = np.abs(y) * 1e-12 if key == "flops" else 0
    bad = np.argwhere(np.abs(got - y) > slack)
    if len(bad):
        row, col = bad[0]
        raise NotAffine(f"{entries[row][2]}: fit gives {int(got[row, col]):,} bytes, simulated "
                        f"{int(y[row, col]):,} (key {key}, point {col}; the layers of this model do not add up)")
    out.coefficients[key] = coef
    _, sv, vt = np.linalg.svd(a / scale, full_matrices=False)
    out.spans[key] = (scale, vt[sv > sv.max() * 1e-10])  # orthonormal rows spanning the fitted (scaled) rows


def fit(observations: list[Observation], s_degree: int) -> LayerFit:
    """Solve each moment kind's coefficients; every observation must be reproduced exactly.

    Where every simulation of a key ran the same ops (a layer's moments, the head's), each point of
    its trace is fitted on its own: a point in time holds a sum of tensors, affine in the features,
    while a moment's maximum is a maximum of such sums and need not be.  Where the op count differs
    (the optimizer's per-parameter loop), the moment's maximum is fitted and must be affine.
    """
    rows: dict[str, list[tuple[np.ndarray, list[int], str]]] = {}
    for ob in observations:
        values = dict(ob.moment_traces)
        if ob.hardware_flops is not None:
            values["flops"] = [ob.hardware_flops]
        if ob.params_bytes is not None:
            values["params"] = [ob.params_bytes]
        for name, trace in values.items():
            key, row = _features(name, ob.layers, ob.chosen, ob.batch, ob.seq, s_degree)
            label = f"{name} of {ob.layers} layers, checkpointed {sorted(ob.chosen)}, b={ob.batch} s={ob.seq}"
            rows.setdefault(key, []).append((row, trace, label))
    out = LayerFit(s_degree)
    for key, entries in rows.items():
        if len({len(t) for _, t, _ in entries}) > 1:  # not one op sequence: fit the moment's maximum
            entries = [(r, [max(t)], label) for r, t, label in entries]
        _solve(key, entries, out)
    return out


@dataclass(frozen=True)
class Job:
    """One few-layer step to simulate."""

    spec: ModelSpec  # with the few layers
    every_n_layers: int
    chosen: tuple
    batch: int
    seq: int
    offload: bool
    device: str
    count_flops: bool
    setup: Setup = Setup()
    recompute: Recompute = Recompute()  # a checkpointed layer's SAC policy and offload kind (no layer set)


def jobs(spec: ModelSpec, batch: int, seq: int, offload: bool, device: str, count_flops: bool,
         setup: Setup = Setup(), recompute: Recompute = Recompute()) -> list[Job]:
    """Every fitting pattern of the few-layer models at (batch, seq), and the check steps; offload runs
    only where layers are checkpointed (a plain step offloads nothing), and so does `recompute` (a SAC
    policy, streamed offload's kind): a plain step is the same step under any of them."""
    chosen = [(layers, n, c) for layers in FIT_LAYERS for n, c in patterns(layers)]
    chosen += [(CHECK_LAYERS, n, tuple(checkpointed_layers(CHECK_LAYERS, n))) for n in CHECK_EVERY]
    return [Job(replace(spec, layers=layers), n, c, batch, seq, offload, device, count_flops, setup,
                recompute if n else Recompute())
            for layers, n, c in chosen if n or not offload]


def run_job(job: Job, simulate: Callable | None = None) -> Observation:
    if simulate is None:
        from .simulate import simulate
    extra = {"recompute": job.recompute} if job.recompute != Recompute() else {}
    try:
        r = simulate(job.spec, job.batch, job.seq, job.every_n_layers, job.offload, device=job.device,
                     count_flops=job.count_flops, trace=True, setup=job.setup, **extra)
    except Exception as exc:
        raise SimulationFailed(f"simulating {job.spec.label} at {job.spec.layers} layers, batch {job.batch}, "
                               f"seq {job.seq}: {type(exc).__name__}: {error_line(exc)}") from None
    flops = r.counted_flops
    hardware = flops["forward"] + flops["backward"] + flops["recompute"] if flops else None
    return Observation(job.spec.layers, frozenset(job.chosen), job.batch, job.seq, dict(r.moment_traces),
                       hardware, r.params_bytes)


@dataclass
class Extrapolation:
    """Fits for one model on one device.

    Batch 1 is its own case: a size-1 dimension lets some reshapes return views where larger batches
    copy, so batch 1 is fitted across sequence lengths (the largest sequence at batch 1 comes from it)
    and batches from 2 up are fitted, affine in the batch, from batches 2 and 3 at the asked length.
    """

    spec: ModelSpec
    seq: int
    device: str
    setup: Setup = Setup()
    recompute: Recompute = Recompute()  # what every checkpointed layer of the fitted steps ran (SAC, offload kind)
    batched: dict = field(default_factory=dict)  # offload -> LayerFit (b >= 2, at seq)
    single: dict = field(default_factory=dict)  # offload -> LayerFit (b = 1, across lengths or at seq)
    across: dict = field(default_factory=dict)  # offload -> "" or why batch 1 is fitted at seq only
    observations: list = field(default_factory=list)  # every simulated few-layer step

    @property
    def simulations(self) -> int:
        return len(self.observations)

    def fit_for(self, offload: bool, batch: int, seq: int) -> LayerFit:
        if batch >= 2:
            if seq != self.seq:
                raise NotAffine(f"batches above 1 are fitted at seq {self.seq} only")
            return self.batched[offload]
        if seq != self.seq and self.across.get(offload):
            raise NotAffine(self.across[offload])
        return self.single[offload]


def seq_points(seq: int, max_positions: int) -> list[int]:
    """The four sequence lengths of the fit across lengths: from half the asked one up, within the model's
    reach (lower ones where the longer ones are out of it).  Three fix a quadratic, the fourth checks it."""
    points = sorted({int(seq * f) for f in SEQ_FACTORS if seq * f <= max_positions})
    while len(points) < 4 and points[0] >= 32:
        points.insert(0, points[0] // 2)
    return points


def extrapolation(spec: ModelSpec, seq: int, device: str, offloads=(False, True), across: bool = True,
                  simulate: Callable | None = None, mapper: Callable = map, setup: Setup = Setup(),
                  recompute: Recompute = Recompute()) -> Extrapolation:
    """Simulate the few-layer models and fit them.

    `simulate` defaults to the FakeTensor step; `mapper` runs the jobs (``map``, or a process pool's map:
    every simulation is independent).  FLOPs are counted at the asked length only, where step time is
    predicted.  A stack whose layers are of several kinds (sliding and global attention, layers without
    rotary embeddings: :mod:`.stacks`) is refused before anything runs: the few-layer copies are its
    first layers, which need not hold every kind, and the fit has one set of coefficients for all layers.
    """
    kinds = layer_kinds(spec)
    if len(set(kinds)) > 1:
        raise NotAffine(f"its {spec.layers} layers are not all alike ({pattern(kinds)}): the few-layer copies "
                        "would not hold the same mix, and the fit treats every layer as one; simulate the full "
                        "depth instead (ckptbench estimate)")
    ex = Extrapolation(spec, seq, device, setup, recompute)
    points = seq_points(seq, spec.max_positions) if across else []
    for off in offloads:
        ex.across[off] = "" if len(points) >= 4 else (
            f"too few sequence lengths below max_positions {spec.max_positions} to fit batch 1 across lengths"
            if across else "not fitted across sequence lengths")
    wanted = {(b, seq) for b in (1, 2, 3)} | {(1, s) for s in points}
    todo = [j for off in offloads for b, s in sorted(wanted)
            for j in jobs(spec, b, s, off, device, s == seq, setup, recompute)]
    if False not in offloads:  # an offload fit takes its plain patterns from the plain runs
        todo += [j for b, s in sorted(wanted) for j in jobs(spec, b, s, False, device, s == seq, setup)
                 if not j.every_n_layers]
    run = functools.partial(run_job, simulate=simulate) if simulate else run_job
    done = dict(zip(todo, mapper(run, todo)))
    ex.observations = list(done.values())

    def seen(b: int, s: int, off: bool) -> list[Observation]:
        return [o for j, o in done.items() if (j.batch, j.seq) == (b, s) and (j.offload == off or not j.every_n_layers)]

    for off in offloads:
        ex.batched[off] = fit(seen(2, seq, off) + seen(3, seq, off), s_degree=0)
        if not ex.across[off]:
            try:
                ex.single[off] = fit([o for s in points for o in seen(1, s, off)], s_degree=2)
                continue
            except NotAffine as exc:
                ex.across[off] = f"memory at batch 1 is not quadratic in the sequence length: {exc}"
        ex.single[off] = fit(seen(1, seq, off), s_degree=0)
    return ex


class Simulated:
    """Peaks and FLOPs of full-depth Cases from an :class:`Extrapolation` (the planner's predictor for a
    model without an analytic estimate).  On a CPU nothing is offloaded to another memory, so an offload
    Case takes the plain fit."""

    def __init__(self, ex: Extrapolation):
        self.ex = ex
        self.source = (f"FakeTensor simulation of {'- and '.join(map(str, FIT_LAYERS))}-layer models, "
                       f"extrapolated to {ex.spec.layers} layers ({ex.simulations} simulated steps)")

    def max_seq_unknown(self) -> list[str]:
        """Why batch 1 could not be fitted across sequence lengths, per offload fit (empty: it was)."""
        return [why for why in self.ex.across.values() if why]

    def _fit(self, case) -> LayerFit:
        return self.ex.fit_for(case.offload and self.ex.device == "cuda", case.batch_size, case.seq_len)

    def peak(self, case) -> int:
        return self._fit(case).peak(case.model.layers, case.checkpointed_layers, case.batch_size, case.seq_len)[0]

    def peak_phase(self, case) -> str:
        """The moment the peak is reached (forward, backward-layer-<i>, ..., optimizer)."""
        return self._fit(case).peak(case.model.layers, case.checkpointed_layers, case.batch_size, case.seq_len)[1]

    def params_bytes(self, case) -> int:
        """Parameter bytes of the full-depth model (fitted on the depth like every other figure)."""
        return self.ex.batched[False].params(case.model.layers)

    def offloaded(self, case) -> int:
        """Checkpointed inputs, b × s × h × bytes each: exact for any model."""
        if not case.offload:
            return 0
        spec = case.model
        return len(case.checkpointed_layers) * case.batch_size * case.seq_len * spec.hidden * spec.bytes_per_element

    def flops(self, case) -> tuple[float, float]:
        fit, layers = self._fit(case), case.model.layers
        return (float(fit.hardware_flops(layers, case.checkpointed_layers, case.batch_size, case.seq_len)),
                float(fit.hardware_flops(layers, (), case.batch_size, case.seq_len)))
