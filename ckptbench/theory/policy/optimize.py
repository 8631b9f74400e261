"""The best checkpointing policy under a memory budget, found exactly: which decoder layers to checkpoint,
how (plain, with transformers' offload, or under a SAC policy), and at which batch.

**What is searched.**  For each batch and each *mode* (plain checkpointing; transformers' offload on a
GPU; each SAC policy the predictor answers), every set S of checkpointed layers of the L-layer model:
2^L sets.  A mode is one for the whole model because the runs it hands over must run: transformers'
offload wraps every checkpointed layer (``offload=True`` is one flag), and a SAC policy travels in the
checkpoint kwargs every layer shares.  The objective is predicted tokens/s (batch × seq / step time),
the constraint the predicted peak within the budget (the plan's own test: :func:`.plan._fits`), and,
where the mode offloads, the host's pinned memory and RAM (:class:`HostBudget`).

**Why a dynamic program over layers is exact.**  The predicted peak is not a sum over layers: it is the
largest of the step's moments (the forward's end, the head's backward, inside each layer's backward, the
embedding, the optimizer step; :mod:`..memory.estimate`, :mod:`..comm.fsdp`, :mod:`..memory.extrapolate`).  A moment inside
layer i's forward or backward holds what the layers *below* i keep (each kept layer its activations, each
checkpointed one its input) and what layer i itself does (recomputed or not), so its bytes are a function
of ``(i, i ∈ S, |S ∩ [0, i)|, 0 ∈ S, L−1 ∈ S)``; every other moment is a function of
``(|S|, 0 ∈ S, L−1 ∈ S)`` (the bottom and top layers' membership are features of the few-layer fit).
The step time is the plain step plus each checkpointed layer's cost (:mod:`..time.steptime`, :mod:`..time.plantime`:
measured forward or traced recomputation, and offload's copies), so it is additive over S.  Hence, with
the bottom and top layers' membership fixed (4 cases), a dynamic program over the layers bottom-up whose
state is the count of checkpointed layers so far visits every set through one of L·(L+1)/2 states, keeps
for each state the lowest cost (ties: the lowest largest moment so far), and at the top adds the moments
that depend on |S| only.  Every set is a path, no state discards a path that could end better, so the
answer is the optimum: optimality gap 0, with no bound to report.  The moment values are read from the
predictor itself (its moments at a few canonical sets, :func:`_canonical`), never re-derived, and the
answer's peak and step time are asked of the predictor and timer again at the optimum (``checked``);
``tests/unit/test_optimize.py`` sets the program beside a brute-force search over all 2^L sets.

A moment a predictor cannot determine (a few-layer fit outside its simulated rows: :class:`..memory.extrapolate.NotAffine`)
makes the states that need it unreachable, and the result says how many sets that left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ...point.case import Case
from ...point.strategy import Recompute
from ..memory.extrapolate import NotAffine

LAYER_MOMENT = re.compile(r"-layer-(\d+)$")
MAX_BATCH = 1 << 16


@dataclass(frozen=True)
class HostBudget:
    """Host memory an offloading policy may use (bytes; None: not limited).  Transformers' offload copies
    each checkpointed layer's input into pinned host memory, so the offloaded bytes of every rank on the
    host count against both."""

    pinned_bytes: int | None = None
    ram_bytes: int | None = None
    ranks_per_host: int = 1

    def refused(self, host_bytes: int) -> str:
        """Why `host_bytes` offloaded per rank breaks a host budget ("" when it does not)."""
        total = host_bytes * self.ranks_per_host
        for name, limit in (("pinned host memory", self.pinned_bytes), ("host RAM", self.ram_bytes)):
            if limit is not None and total > limit:
                return (f"{name}: {total / 2**30:.2f} GiB offloaded ({self.ranks_per_host} rank"
                        f"{'s' * (self.ranks_per_host > 1)} × {host_bytes / 2**30:.2f} GiB) > {limit / 2**30:.2f} GiB")
        return ""


@dataclass
class Solution:
    batch: int
    mode: str  # "" plain | "offload" | "sac-<policy>"
    layers: tuple[int, ...]
    step_s: float
    tokens_per_s: float
    peak_bytes: int
    host_bytes: int = 0
    depth: int = 0  # the model's layers
    checked: dict = field(default_factory=dict)  # the predictor and timer asked again at this policy


@dataclass
class Result:
    best: Solution | None
    per_batch: list[Solution]  # the best policy of each batch and mode that fits
    states: int = 0  # dynamic-program states visited
    evaluations: int = 0  # distinct canonical sets whose moments were read
    undetermined: int = 0  # canonical sets the predictor could not answer
    refused: list[tuple[Solution, str]] = field(default_factory=list)  # faster policies a host budget refused
    proof: str = ""
    # the relaxation: tokens/s at the fastest batch some set fits if no layer's recompute cost anything
    # (memory ignored within it); no policy can beat it
    bound_tokens_per_s: float | None = None

    @property
    def optimality_gap(self) -> float | None:
        """0 when every canonical set was answered (the program reached every set: exact), None (unknown)
        when some were not: the optimum among the sets left out is bounded by :attr:`gap_bound` only."""
        if self.best is None:
            return None
        return 0.0 if self.undetermined == 0 else None

    @property
    def gap_bound(self) -> float | None:
        """How far below the relaxation bound the optimum is (≥ 0): an upper bound on any gap."""
        if self.best is None or not self.bound_tokens_per_s:
            return None
        return self.bound_tokens_per_s / self.best.tokens_per_s - 1


def mode_recompute(mode: str, layers: tuple[int, ...]) -> tuple[bool, Recompute]:
    """(Case.offload, Recompute) of a mode over the layer set `layers`."""
    sac = mode[4:] if mode.startswith("sac-") else ""
    return mode == "offload", Recompute(layers=tuple(layers), sac=sac)


def policy_case(template: Case, batch: int, layers, mode: str = "") -> Case:
    """`template` at `batch`, checkpointing exactly `layers` in `mode` (none when `layers` is empty)."""
    offload, rc = mode_recompute(mode, tuple(sorted(layers)))
    if not layers:
        offload, rc = False, Recompute()
    return replace(template, batch_size=batch, every_n_layers=0, offload=offload, recompute=rc)


def moments_of(predict, case: Case) -> dict[str, int]:
    """Every moment's predicted device bytes (name -> the largest total of that name), from the predictor
    the plan uses: the analytic estimate's walk, one FSDP2 rank's, or the few-layer fit's."""
    from ..memory.estimate import estimate_case
    from . import plan as planner
    from .planstrategies import PerStrategy

    if isinstance(predict, PerStrategy):
        predict = predict._for(case)
    out: dict[str, int] = {}
    if isinstance(predict, planner.ShardedAnalytic):
        from ..comm.fsdp import rank_moments

        for name, total, _ in rank_moments(predict._sharded(case)):
            out[name] = max(out.get(name, 0), total)
        return out
    if isinstance(predict, planner.Analytic):
        est = estimate_case(case)
        static = est.params_bytes + est.optimizer_bytes
        for name, kind, acts, grads in est.moments:
            if kind != "boundary":  # the walk's peak is over its phases' moments (boundaries are inside them)
                out[name] = max(out.get(name, 0), static + acts + grads)
        return out
    if hasattr(predict, "_fit"):  # the few-layer fit (.extrapolate.Simulated)
        return predict._fit(case).moments(case.model.layers, case.checkpointed_layers, case.batch_size,
                                          case.seq_len)
    raise ValueError(f"no moments from predictor {type(predict).__name__}")


def _canonical(L: int, i: int | None, member: bool, below: int, first: bool, top: bool) -> tuple[int, ...] | None:
    """A layer set with 0 ∈ S iff `first`, L−1 ∈ S iff `top`, and (for a layer moment, `i` not None) i ∈ S
    iff `member` with `below` members under i; for the other moments (`i` None) `below` members in all.
    Members are packed low, so few distinct sets answer every state.  None where no non-empty set has them."""
    if i is None:  # |S| = below
        middle = below - first - top
        if below < 1 or middle < 0 or middle > L - 2:
            return None
        return tuple(sorted(({0} if first else set()) | set(range(1, 1 + middle)) | ({L - 1} if top else set())))
    if (i == 0 and (member != first or below)) or (i == L - 1 and member != top):
        return None
    if i > 0 and (below < first or below - first > i - 1):
        return None
    if member:  # 0 (with first), then a run from i − below + first up to the top's neighbour: every layer of
        # the run has as many plain layers below it as i has, so one set answers all of them
        chosen = set(range(first)) | set(range(first + i - below, L - 1))
    else:
        chosen = set(range(1 - first, 1 - first + below))  # 0..below-1 with first, 1..below without
    if top:
        chosen.add(L - 1)
    if not chosen:  # the moments of a step that checkpoints something: one layer above i, not the top
        if i + 1 >= L - 1:
            return None
        chosen.add(L - 2)
    return tuple(sorted(chosen))


class _Table:
    """Moments of canonical sets at one batch and mode, each set's read once."""

    def __init__(self, predict, template: Case, batch: int, mode: str, extra: int):
        self.predict, self.template, self.batch, self.mode, self.extra = predict, template, batch, mode, extra
        self.sets: dict[tuple, dict | None] = {}

    def _read(self, layers: tuple[int, ...]) -> dict | None:
        if layers not in self.sets:
            try:
                self.sets[layers] = moments_of(self.predict, policy_case(self.template, self.batch, layers, self.mode))
            except NotAffine:
                self.sets[layers] = None
        return self.sets[layers]

    def layer(self, L: int, i: int, member: bool, below: int, first: bool, top: bool) -> int | None:
        found = _canonical(L, i, member, below, first, top)
        moments = None if found is None else self._read(found)
        if moments is None:
            return None
        return self.extra + max((v for k, v in moments.items() if (m := LAYER_MOMENT.search(k)) and int(m[1]) == i),
                                default=0)

    def rest(self, L: int, count: int, first: bool, top: bool) -> int | None:
        found = _canonical(L, None, False, count, first, top)
        moments = None if found is None else self._read(found)
        if moments is None:
            return None
        return self.extra + max(v for k, v in moments.items() if not LAYER_MOMENT.search(k))


def solve_layers(L: int, table: _Table, costs: list[float], fits, allowed=lambda count: "") -> tuple:
    """The exact dynamic program (see the module's text) at one batch and mode: (cost, peak, layers, states,
    refused) of the cheapest non-empty set whose every moment `fits`, ties to the lowest peak; `allowed(k)`
    says why k checkpointed layers are refused ("" when they are not), and `refused` keeps the cheapest
    refused (cost, peak, layers, why)."""
    best, refused, states = None, None, 0
    for first in (False, True):
        for top in (False, True):
            if L == 1 and first != top:
                continue
            # dp[count] = (cost, largest moment so far, layers)
            dp: dict[int, tuple[float, int, tuple[int, ...]]] = {0: (0.0, 0, ())}
            for i in range(L):
                nxt: dict[int, tuple[float, int, tuple[int, ...]]] = {}
                choices = (first,) if i == 0 else (top,) if i == L - 1 else (False, True)
                for below, (cost, high, chosen) in dp.items():
                    for member in choices:
                        states += 1
                        value = table.layer(L, i, member, below, first, top)
                        if value is None or not fits(value):
                            continue
                        cand = (cost + (costs[i] if member else 0.0), max(high, value),
                                chosen + ((i,) if member else ()))
                        key = below + member
                        if key not in nxt or cand[:2] < nxt[key][:2]:
                            nxt[key] = cand
                dp = nxt
            for count, (cost, high, chosen) in dp.items():
                rest = table.rest(L, count, first, top) if count else None
                if rest is None or not fits(rest):
                    continue
                cand = (cost, max(high, rest), chosen)
                why = allowed(count)
                if why:
                    if refused is None or cand[:2] < refused[:2]:
                        refused = (*cand, why)
                elif best is None or cand[:2] < best[:2]:
                    best = cand
    return best, states, refused


def _brute(L: int, table: _Table, costs: list[float], fits, allowed=lambda count: "") -> tuple:
    """Every non-empty set of a model of one or two layers, read whole (the canonical sets need L ≥ 3)."""
    best, refused = None, None
    for mask in range(1, 1 << L):
        chosen = tuple(i for i in range(L) if mask >> i & 1)
        moments = table._read(chosen)
        if moments is None:
            continue
        high = table.extra + max(moments.values())
        if not fits(high):
            continue
        cand, why = (sum(costs[i] for i in chosen), high, chosen), allowed(len(chosen))
        if why:
            refused = refused if refused is not None and refused[:2] <= cand[:2] else (*cand, why)
        elif best is None or cand[:2] < best[:2]:
            best = cand
    return best, 1 << L, refused


def optimize(template: Case, a, predict, timer, modes: tuple[str, ...] = ("",), host: HostBudget = HostBudget(),
             max_batch: int = MAX_BATCH) -> Result:
    """The policy (batch, mode, checkpointed layers) of highest predicted tokens/s whose predicted peak fits
    `a` (:class:`.plan.Assumptions`) and whose offload fits `host`: every batch from 1 up to the first at
    which nothing fits in any mode, each mode, every layer set (see the module's text).  `predict` and
    `timer` are the plan's (:func:`.plan.step_seconds` prices a Case, collectives included)."""
    from .plan import step_seconds

    L = template.model.layers
    extra = predict.params_bytes(template) if a.world > 1 and a.sharding == "ddp" else 0

    def fits(total: int) -> bool:
        return a.needed(total) <= a.memory_bytes

    def seconds(batch: int, layers, mode: str) -> float | None:
        return step_seconds(policy_case(template, batch, layers, mode), a, predict, timer)[0]

    result = Result(None, [])
    best_refused: tuple[Solution, str] | None = None
    tables: list[_Table] = []
    for batch in range(1, max_batch + 1):
        found = []
        for mode in modes:
            table = _Table(predict, template, batch, mode, extra)
            tables.append(table)
            plain = table._read(())
            none_fits = plain is not None and fits(extra + max(plain.values()))
            search = _brute if L <= 2 else solve_layers
            feasible, _, _ = search(L, table, [0.0] * L, fits)
            if not feasible and not none_fits:
                continue
            base = seconds(batch, (), mode)
            if base is None:
                continue
            relaxed = a.world * batch * template.seq_len / base
            result.bound_tokens_per_s = max(result.bound_tokens_per_s or 0.0, relaxed)
            costs = [seconds(batch, (i,), mode) - base for i in range(L)]
            per_layer = predict.offloaded(policy_case(template, batch, (0,), mode)) if mode == "offload" else 0

            def allowed(count: int, per_layer=per_layer) -> str:
                return host.refused(count * per_layer) if per_layer else ""

            chosen, states, refused = search(L, table, costs, fits, allowed)
            result.states += states
            options = ([(0.0, extra + max(plain.values()), ())] if none_fits else []) + ([chosen] if chosen else [])
            kept = _prefer_every_n(min(options, key=lambda o: o[:2]), L, table, costs, fits) if options else None
            if refused and (kept is None or refused[:2] < kept[:2]):
                sol = _solution(template, batch, mode, refused[2], refused[1], base + refused[0], a, predict, timer,
                                extra)
                if best_refused is None or sol.tokens_per_s > best_refused[0].tokens_per_s:
                    best_refused = (sol, refused[3])
            if kept is not None:
                found.append(_solution(template, batch, mode, kept[2], kept[1], base + kept[0], a, predict, timer,
                                       extra))
        if not found:
            break
        result.per_batch += found
    result.evaluations = sum(len(t.sets) for t in tables)
    result.undetermined = sum(v is None for t in tables for v in t.sets.values())
    if result.per_batch:
        result.best = max(result.per_batch, key=lambda s: (s.tokens_per_s, -s.peak_bytes))
    if best_refused and (result.best is None or best_refused[0].tokens_per_s > result.best.tokens_per_s):
        result.refused.append(best_refused)
    if result.undetermined:
        bound = (f": at most {result.gap_bound:+.1%}, the relaxation bound" if result.gap_bound is not None
                 else "")
        gap = f"optimality gap unknown ({result.undetermined} canonical sets unanswered){bound}"
    else:
        gap = "optimality gap 0: every set reached"
    result.proof = (f"exact: dynamic program over {L} layers × checkpointed-so-far counts, bottom and top layer "
                    f"fixed in turn ({result.states} states, {result.evaluations} canonical sets read from the "
                    f"predictor), every batch up to the first where nothing fits; {gap}")
    return result


def _prefer_every_n(found: tuple, L: int, table: _Table, costs: list[float], fits) -> tuple:
    """`found` (cost, peak, layers), or an ``every_n_layers`` pattern as cheap and as low: the same optimum,
    which transformers' TrainingArguments can say."""
    from ...point.strategy import checkpointed_layers

    for n in range(1, L + 1):
        pattern = tuple(checkpointed_layers(L, n))
        moments = table._read(pattern) if len(pattern) == len(found[2]) and pattern != found[2] else None
        if moments is None:
            continue
        cand = (sum(costs[i] for i in pattern), table.extra + max(moments.values()), pattern)
        if fits(cand[1]) and cand[:2] <= found[:2]:
            return cand
    return found


def _solution(template, batch, mode, layers, peak, summed_s, a, predict, timer, extra) -> Solution:
    """A policy with its predicted figures, the predictor and timer asked again at it (``checked``)."""
    from .plan import step_seconds

    case = policy_case(template, batch, layers, mode)
    step = step_seconds(case, a, predict, timer)[0]
    again = predict.peak(case) + extra
    sol = Solution(batch, mode, tuple(layers), step, a.world * batch * case.seq_len / step, peak,
                   predict.offloaded(case) if case.offload else 0, case.model.layers)
    sol.checked = {"peak_bytes": again, "peak_agrees": again == peak, "step_s": step,
                   "step_additive": abs(step - summed_s) <= 1e-9 * max(1.0, step)}
    return sol
