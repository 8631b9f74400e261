"""Which checkpointing setting fits a memory and is fastest: answered from the estimate, before any run.

For each strategy (no checkpointing; every distinct set of checkpointed layers that ``every_n_layers``
= 1…L gives; each with and without offload) the planner finds, by bisection over the estimated peak,
the largest batch that fits at the asked sequence length and the longest sequence that fits at batch 1,
then predicts the step time at that batch (or at the caller's fixed batch): on this machine (or on the
card, when the plan runs on it) from baseline steps measured here and transformed by the step-time model
(:mod:`..time.steptime`: recomputed layers' measured forward, offload's copies at the link; the caller's timer),
on a card that is not here from the traced step at the rates kernels reached on a measured card
(:mod:`..time.achieved`: an expected time with the held-out interval of that card's run; the datasheet roofline
of :mod:`..time.plantime`, a lower bound, only when asked), plus the collectives of data parallel ranks that
compute does not hide (:mod:`..comm.overlap`: FSDP2's prefetched all-gathers and reduce-scatters, DDP's buckets
during the backward, local SGD's blocking averaging).
The recommendation is the highest predicted tokens/s that fits, so a larger batch wins only where it
really is faster per token.  With
``layer_sets`` the strategies also hold, for each count of layers no ``every_n_layers`` checkpoints, the
best set of that many layers (:mod:`..memory.layersets`), with and without offload.

On CUDA the allocator holds more than its tensors (block rounding and cached blocks: reserved over
allocated) and the process holds a CUDA context; the estimate sees neither, so a CUDA plan adds
:data:`CUDA_RESERVED_MARGIN` to the peak and :data:`CUDA_CONTEXT_BYTES` on top.  Both are stated in the
output and replaced by measured values when a calibration gives them.  On CPU nothing is added.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from ...point.cards import CARDS
from ...point.case import Case
from ...point.setup import Setup
from ...point.strategy import Recompute, checkpointing_name, offload_suffix
from ...point.training import TrainSpec
from ..comm.fsdp import fsdp_comm_estimate, fsdp_memory_estimate
from ..comm.network import Link
from ..comm.overlap import split_by_flops
from ..memory.estimate import estimate_case
from ..memory.extrapolate import NotAffine
from ..memory.layersets import layer_set_strategies
from ..time.flops import hardware_flops_per_token, peak_flops
from ..time.planspeed import comm_time, default_timer, step_time
from .planstrategies import candidates, strategies  # noqa: F401  (strategies: part of the plan's API)

CUDA_RESERVED_MARGIN = 0.10  # reserved / allocated − 1 the planner assumes until a GPU run measures it
CUDA_CONTEXT_BYTES = 600 * 2**20  # CUDA context and library workspaces, stated apart by the meters
HOST_LINK_BYTES_PER_S = 20e9  # pinned host<->device copies, each way, until calibrated
MAX_BATCH = 1 << 16
# Datasheet memory of the cards `--device` names (bytes).
DEVICE_MEMORY = {name: memory for name, (_, memory) in CARDS.items()}


@dataclass(frozen=True)
class Assumptions:
    """What the plan takes as given; each says where it comes from."""

    memory_bytes: int
    device: str  # cpu | cuda
    device_name: str | None = None  # for the datasheet FLOP/s (H100, H200, ...)
    reserved_margin: float = 0.0
    context_bytes: int = 0
    peak_flops_per_s: float | None = None  # a card's matmul FLOP/s: its datasheet's, or a calibration's
    link_bytes_per_s: float = HOST_LINK_BYTES_PER_S
    sources: dict = field(default_factory=dict)  # figure -> "default" | "calibration FILE" | "datasheet"
    step_time_source: str = ""  # where the step times come from (measured here at ... | datasheet ...)
    # data parallel over `world` ranks (each holds the whole model, plus DDP's gradient buckets), averaging
    # every step (local_sgd_steps 0: DDP) or every K steps, over the named network link
    world: int = 1
    local_sgd_steps: int = 0
    network: str = "NVLink"
    # ddp: every rank the whole model (+ DDP's buckets); fsdp: FSDP2, each rank's memory as theory/comm/fsdp.py
    # composes it, the all-gathers and reduce-scatters projected on the link
    sharding: str = "ddp"
    # a world past ranks_per_host crosses hosts: `network` is then the network between them, `intra` the
    # link inside each; a measured link (a calibration's collective) replaces both
    ranks_per_host: int = 8
    intra: str = "NVLink"
    measured_link: Link | None = None

    def needed(self, peak: int) -> int:
        """Device memory a step with this estimated peak needs."""
        return int(peak * (1 + self.reserved_margin)) + self.context_bytes


@dataclass
class Option:
    strategy: str
    every_n_layers: int
    offload: bool
    max_batch: int  # at the asked sequence length; 0: not even batch 1 fits
    max_seq: int | None  # at batch 1 (None: the predictor does not reach other lengths)
    peak_bytes: int | None = None  # estimated, at max_batch
    step_s: float | None = None
    tokens_per_s: float | None = None
    recompute_flops_share: float = 0.0
    layers: tuple[int, ...] = ()  # a layer set (every_n_layers 0), when the plan was asked for them
    batch: int = 0  # the batch the step is timed at: max_batch, or the caller's fixed batch (0: none fits)
    compute_s: float | None = None  # the step's compute (all micro-batches, optimizer included)
    comm_s: float | None = None  # its collectives on the link, end to end
    exposed_s: float | None = None  # the part of them compute does not hide (in step_s)
    step_low_s: float | None = None  # the step's interval where the timer has one (measured card's run)
    step_high_s: float | None = None

    def __post_init__(self):
        if not self.batch and self.step_s is not None:  # made with a step time: timed at its largest batch
            self.batch = self.max_batch
    sac: str = ""  # the SAC policy of every checkpointed layer ("": plain checkpointing)
    offload_kind: str = ""  # "streamed": streamed offload (where offload); "": transformers' own


class Analytic:
    """Peaks and FLOPs from the analytic estimate of the model's family."""

    source = "analytic estimate"

    def max_seq_unknown(self) -> list[str]:
        """The estimate answers every length: never a reason."""
        return []

    def peak(self, case: Case) -> int:
        if case.recompute.sac:  # what a policy keeps is simulated (planstrategies.PerStrategy), never guessed
            raise ValueError(f"the analytic estimate does not model SAC policy {case.recompute.sac}")
        return estimate_case(case).peak_bytes

    def offloaded(self, case: Case) -> int:
        return estimate_case(case).offloaded_bytes

    def peak_phase(self, case: Case) -> str:
        """The moment the peak is reached: forward, backward-layer-<i>, ..., optimizer."""
        return estimate_case(case).peak_phase

    def params_bytes(self, case: Case) -> int:
        return estimate_case(case).params_bytes

    def flops(self, case: Case) -> tuple[float, float]:
        """(hardware FLOPs of the step, the same without checkpointing)."""
        tokens = case.batch_size * case.seq_len * case.grad_accum
        n_ckpt = len(case.checkpointed_layers)
        return (hardware_flops_per_token(case.model, case.seq_len, n_ckpt) * tokens,
                hardware_flops_per_token(case.model, case.seq_len, 0) * tokens)


class ShardedAnalytic(Analytic):
    """One FSDP2 rank's peak (:func:`..comm.fsdp.fsdp_memory_estimate`: the rank's shards, the gathered root and
    layers in flight, FSDP2's all-gather and reduce-scatter buffers, the activations of its micro-batch;
    equal to what was measured on CPU, :data:`..comm.fsdp.PEAK_TOLERANCE`) for the families and precisions the
    analytic estimate describes (:func:`~ckptbench.point.case.analytic_sharded_point`: pure, or bf16-mixed as
    FSDP2's MixedPrecisionPolicy runs it, bf16 compute over fp32 shards)."""

    source = "analytic estimate, one FSDP2 rank (theory/comm/fsdp.py)"

    def __init__(self, world: int):
        self.world = world

    def _sharded(self, case: Case) -> Case:
        return replace(case, world_size=self.world, setup=replace(case.setup, sharding="fsdp"))

    def peak(self, case: Case) -> int:
        return fsdp_memory_estimate(self._sharded(case))["peak_bytes"]

    def collectives(self, case: Case) -> tuple[int, float]:
        """(collectives, bus bytes) of one optimizer step: the all-gathers and reduce-scatters."""
        comm = fsdp_comm_estimate(case.model, self.world, case.grad_accum, case.setup.autocast)
        return (comm["allgather_count"] + comm["reduce_scatter_count"],
                comm["allgather_bus_bytes"] + comm["reduce_scatter_bus_bytes"])


def _fits(case: Case, a: Assumptions, predict) -> tuple[bool, int]:
    peak = predict.peak(case)
    if a.world > 1 and a.sharding == "ddp":  # DDP keeps a bucket per gradient byte (gradient_as_bucket_view off)
        peak += predict.params_bytes(case)
    return a.needed(peak) <= a.memory_bytes, peak


def _largest(make, a: Assumptions, hi: int, predict) -> int:
    """The largest k in 1..hi for which make(k) fits (0 when 1 does not): doubling, then bisection."""
    if not _fits(make(1), a, predict)[0]:
        return 0
    lo, step = 1, 2
    while step <= hi and _fits(make(step), a, predict)[0]:
        lo, step = step, step * 2
    high = min(step, hi + 1)  # first known (or assumed) not to fit
    while high - lo > 1:
        mid = (lo + high) // 2
        if _fits(make(mid), a, predict)[0]:
            lo = mid
        else:
            high = mid
    return lo


def step_seconds(case: Case, a: Assumptions, predict=None, timer=None) -> tuple[float | None, float]:
    """(predicted step time, recompute share of the FLOPs): :func:`..time.planspeed.step_time`'s step."""
    predict = predict or Analytic()
    total, plain = predict.flops(case)
    share = (total - plain) / total if total else 0.0
    t = step_time(case, a, predict, timer)
    return (t.step_s if t else None), share


def comm_seconds(case: Case, a: Assumptions, predict=None, compute=None) -> float:
    """The collectives' seconds a step waits for (:func:`..time.planspeed.comm_time`); `compute` split by FLOPs
    when not given."""
    if a.world < 2:
        return 0.0
    if compute is None:
        compute = split_by_flops(1.0, case.model.layers, tuple(case.checkpointed_layers))
    return comm_time(case, a, predict or Analytic(), compute).exposed_s


def plan(model, seq: int, a: Assumptions, train: TrainSpec | None = None, predict=None,
         setup: Setup = Setup(), layer_sets: bool = False, timer=None, sac: tuple[str, ...] = (),
         streamed: bool = False, batch: int = 0) -> list[Option]:
    """Every strategy's largest batch and sequence, predicted speed, best first.

    `predict` gives each Case's peak, offloaded bytes and FLOPs: :class:`Analytic` by default, or the
    few-layer simulation extrapolated (:class:`..memory.extrapolate.Simulated`) for a model without one; with `sac`
    (SAC policies to rank) it must answer those policies' Cases too
    (:class:`.planstrategies.PerStrategy`).  `streamed` also ranks streamed offload beside each offload.
    A largest sequence the predictor cannot reach (batch 1 not fitted across lengths) is None.  `timer`
    gives a Case's step time (:func:`default_timer` when None).  `batch`: time every strategy at that local
    batch instead of its largest (a strategy that cannot fit it gets no step time).
    """
    train, predict = train or TrainSpec(), predict or Analytic()
    timer = timer or default_timer(a)

    def case(batch: int, s: int, n: int, off: bool, rc: Recompute) -> Case:
        return Case(model=model, train=train, batch_size=batch, seq_len=s, every_n_layers=n, offload=off,
                    device=a.device, setup=setup, recompute=rc)

    chosen = candidates(model.layers, sac, streamed)
    if layer_sets:  # each set picked by its estimated peak at batch 1 (the FLOPs depend on the count only)
        sets = layer_set_strategies(model.layers,
                                    lambda ls: _fits(case(1, seq, 0, False, Recompute(layers=ls)), a, predict)[1])
        chosen += [(0, off, Recompute(layers=ls)) for ls in sets for off in (False, True)]
    options = []
    for n, off, rc in chosen:
        max_batch = _largest(lambda b, n=n, off=off, rc=rc: case(b, seq, n, off, rc), a, MAX_BATCH, predict)
        try:
            max_seq = _largest(lambda s, n=n, off=off, rc=rc: case(1, s, n, off, rc), a, model.max_positions,
                               predict)
        except NotAffine:
            max_seq = None
        opt = Option(checkpointing_name(n, off, rc), n, off, max_batch, max_seq, layers=rc.layers, sac=rc.sac,
                     offload_kind=rc.offload if off else "")
        opt.batch = (batch if batch <= max_batch else 0) if batch else max_batch
        if opt.batch:
            best = case(opt.batch, seq, n, off, rc)
            opt.peak_bytes = _fits(best, a, predict)[1]
            total, plain = predict.flops(best)
            opt.recompute_flops_share = (total - plain) / total if total else 0.0
            t = step_time(best, a, predict, timer)
            if t is not None:
                opt.step_s, opt.compute_s, opt.comm_s, opt.exposed_s = t.step_s, t.compute_s, t.comm_s, t.exposed_s
                opt.step_low_s, opt.step_high_s = t.low_s, t.high_s
                opt.tokens_per_s = a.world * opt.batch * seq / t.step_s
        options.append(opt)
    return sorted(options, key=lambda o: (-(o.tokens_per_s or 0), -o.max_batch))


def _suffix(o: Option) -> str:
    """What a strategy adds to its checkpointed layers: its SAC policy and its offload."""
    return (f"+sac-{o.sac}" if o.sac else "") + offload_suffix(o.offload, o.offload_kind)


def _family(o: Option) -> str:
    name = ("layers" if o.layers else "none" if o.every_n_layers == 0 else "full" if o.every_n_layers == 1
            else "every-n")
    return name + _suffix(o)


def merged(options: list[Option]) -> list[Option]:
    """One row per distinct answer: strategies of one family whose every predicted figure is the same
    (every-16 … every-31 of 32 layers each checkpoint two layers) become one row, named by their range."""
    rows: list[Option] = []
    runs: dict[tuple, list[Option]] = {}  # each answer's options, in the order the first of them comes
    for o in options:
        runs.setdefault((_family(o), o.max_batch, o.max_seq, o.peak_bytes, o.step_s, o.tokens_per_s), []).append(o)
    for run in runs.values():
        first = run[0]
        if len(run) == 1:
            rows.append(first)
            continue
        suffix = _suffix(first)
        if first.layers:  # layer sets of several counts: named by the counts
            ks = sorted(len(o.layers) for o in run)
            rows.append(replace(first, strategy=f"layer sets of {ks[0]}…{ks[-1]}{suffix} ({len(run)} settings)"))
            continue
        ns = sorted(o.every_n_layers for o in run)
        rows.append(replace(first, strategy=f"every-{ns[0]}…{ns[-1]}{suffix} ({len(run)} settings)"))
    return rows


def shown_rows(options: list[Option], count: int) -> list[Option]:
    """The first `count` merged rows, and the best row of each family (none, every-n, full, each with and
    without offload) that is not among them: the real alternatives stay in view."""
    rows = merged(options)
    shown = rows[:count]
    for family in dict.fromkeys(_family(o) for o in rows):
        if not any(_family(o) == family for o in shown):
            shown.append(next(o for o in rows if _family(o) == family))
    return shown


def recommendation(options: list[Option], device: str = "cuda") -> str:
    """The fastest fitting option, the runner-up, and why the one beats the other.  On a CPU offload copies
    nothing (the host is the device), so it is never the reason a runner-up is slower."""
    fitting = [o for o in options if o.batch and o.tokens_per_s]
    if not fitting:
        return "nothing fits: not even batch 1 of any strategy at this sequence length"
    best = fitting[0]
    line = f"{best.strategy} at batch {best.batch}: {best.tokens_per_s:,.0f} tokens/s predicted"
    if best.step_low_s and best.step_high_s:
        scale = best.tokens_per_s * best.step_s
        line += f" ({scale / best.step_high_s:,.0f}-{scale / best.step_low_s:,.0f})"
    if len(fitting) > 1:
        second = fitting[1]
        why = []
        if second.batch < best.batch:
            why.append(f"it fits batch {second.max_batch} only")
        if second.recompute_flops_share > best.recompute_flops_share:
            why.append(f"it recomputes {second.recompute_flops_share:.0%} of its FLOPs")
        if second.offload and not best.offload and device == "cuda":
            why.append("its offload copies cost time")
        elif second.offload and not best.offload and second.strategy.replace("+offload", "", 1) == best.strategy:
            why.append(f"on a CPU offload copies nothing: {best.strategy}'s step and memory")
        if second.exposed_s and best.exposed_s is not None and second.exposed_s > best.exposed_s * 1.05 + 1e-6:
            why.append(f"{second.exposed_s * 1e3:,.0f} ms a step of its collectives is not hidden "
                       f"({best.exposed_s * 1e3:,.0f} ms for {best.strategy})")
        if not why and second.batch > best.batch:
            why.append(f"batch {second.batch} fits, but its predicted step is slower per token")
        if not why and second.peak_bytes and best.peak_bytes:  # as fast: what tells them apart is memory
            why.append(f"it peaks at {second.peak_bytes / 2**30:.2f} GiB at batch {second.batch}, "
                       f"{best.strategy} at {best.peak_bytes / 2**30:.2f} GiB")
        line += (f"; runner-up {second.strategy} at batch {second.batch}, "
                 f"{second.tokens_per_s / best.tokens_per_s:.2f}× as fast" + (f" ({'; '.join(why)})" if why else ""))
    return line


def nothing_fits(model, seq: int, a: Assumptions, predict, setup: Setup = Setup(),
                 train: TrainSpec | None = None) -> str:
    """Why no strategy fits, part by part, and what would change it.

    The smallest step there is (every layer checkpointed, offloaded on a GPU, batch 1) against the budget:
    its weights, their gradients and AdamW's two moments (each the weights' size: fp32 master weights in
    mixed precision, the model's dtype in a pure one) and the activations on top."""
    gib = 2**30
    off = a.device == "cuda"
    case = Case(model=model, train=train or TrainSpec(), batch_size=1, seq_len=seq, every_n_layers=1, offload=off,
                device=a.device, setup=setup)
    peak = _fits(case, a, predict)[1]
    budget = a.memory_bytes - a.context_bytes
    if setup.lora or setup.optimizer != "adamw" or a.sharding != "ddp":
        return (f"nothing fits: even full checkpointing{'+offload' if off else ''} at batch 1 and seq {seq} peaks "
                f"at {peak / gib:.1f} GiB ({a.needed(peak) / gib:.1f} GiB with the allocator's reserve and context) "
                f"on {a.memory_bytes / gib:.1f} GiB: a shorter sequence"
                + (", more ranks" if a.sharding == "fsdp" else ", sharding the state (FSDP)")
                + (", a smaller adapter rank" if setup.lora else ", LoRA adapters") + " or a larger card")
    weights = predict.params_bytes(case)
    state = 4 * weights  # weights + gradients + exp_avg + exp_avg_sq
    head = (f"nothing fits: even full checkpointing{'+offload' if off else ''} at batch 1 and seq {seq} peaks at "
            f"{peak / gib:.1f} GiB ({a.needed(peak) / gib:.1f} GiB with the allocator's reserve and context) on "
            f"{a.memory_bytes / gib:.1f} GiB. Weights {weights / gib:.1f} GiB + gradients {weights / gib:.1f} + "
            f"AdamW state {2 * weights / gib:.1f} = {state / gib:.1f} GiB")
    if state * (1 + a.reserved_margin) >= budget:
        fixes = ["shard that state across ranks (FSDP: about 1/N of it per rank)",
                 "train adapters instead (LoRA: the base frozen, gradients and AdamW state for the adapters only)",
                 "a lighter optimizer (8-bit AdamW, Adafactor: far less than 2× the weights in state)"]
        if setup.autocast == "" and model.dtype == "fp32":
            fixes.append("pure bf16 weights halve all three (mixed precision does not: its master weights, "
                         "gradients and state stay fp32)")
        return f"{head} do not fit before a single activation: {'; '.join(fixes)}"
    left = budget / (1 + a.reserved_margin) - state
    phase = getattr(predict, "peak_phase", None)
    if phase is not None and phase(case) == "optimizer":
        # the step's largest moment is the optimizer's own temporaries: no sequence or offload lowers it
        fixes = ["sharding the state (FSDP)", "LoRA adapters", "a lighter optimizer (SGD, Adafactor, 8-bit AdamW)"]
        if a.device == "cuda" and setup.optimizer == "adamw":
            fixes.insert(0, "AdamW's per-parameter loop (--optimizer adamw-loop: two copies of the largest tensor "
                            "where torch's default on CUDA, foreach, holds a copy of every parameter)")
        return (f"{head} leave {left / gib:.1f} GiB, and the optimizer step needs {(peak - state) / gib:.1f} GiB "
                f"more (its temporaries: the peak is the optimizer step, after the activations are freed, so a "
                f"shorter sequence or offload does not lower it): {'; '.join(fixes)}")
    return (f"{head} leave {left / gib:.1f} GiB, and the activations need {(peak - state) / gib:.1f} GiB: "
            "a shorter sequence, offload, or sharding the state (FSDP) to make room")


def to_dict(options: list[Option], a: Assumptions, seq: int | None = None, model: str | None = None,
            why_nothing: str = "") -> dict:
    return {"model": model, "seq_len": seq, "assumptions": asdict(a), "options": [asdict(o) for o in options],
            "rows": [asdict(o) for o in merged(options)],  # equivalent strategies as one row
            "recommendation": why_nothing if why_nothing and not any(o.max_batch for o in options)
            else recommendation(options, a.device)}


def datasheet_peak(device_name: str | None, dtype: str) -> float | None:
    found = peak_flops(device_name, dtype)
    return found[0] if found else None

