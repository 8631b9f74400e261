"""The fastest setting, named only when it is: per sequence length and per memory budget, like with like.

Points are compared only with points of the same variant (model, precision, attention, loop,
distribution: :func:`~.columns._variant`) and the same sequence length, and within a memory budget only
with points whose measured peak fits it.  Throughput (tokens/s) is what is compared, since batch sizes
differ; its interval is the tokens of a step over the step time's interval, with the same coverage.

A single winner is named only when its interval lies above every other point's: both intervals hold
their medians with their stated coverage, so when they do not overlap the order is the true one at
least that often.  Otherwise the answer is the settings tied within noise: those whose interval reaches
the best one's.  A point that ran oversubscribed on a loaded machine (:mod:`ckptbench.store.load`) never
wins; the answer says it was left out.  The winner (or each tied setting) is set against no
checkpointing at the same batch: its peak saving and its step-time ratio, with that ratio's interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ..base.finite import finite_number
from ..measure.interval import LEVEL, coverage_label
from ..store.load import load_state
from ..store.stats import ratio_ci
from .columns import no_checkpointing, setup_of

GIB = 2**30
TIED_SHOWN = 4  # tied settings set against none, one by one; past this many, counted


@dataclass(frozen=True)
class Candidate:
    """One point as the question sees it: its name, throughput and that throughput's interval."""

    name: str
    tok_s: float
    low: float | None  # tokens/s interval (None: too few steps for one)
    high: float | None
    coverage: float | None
    row: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None


@dataclass
class Answer:
    """``winner``: one setting separated from all others; ``tied``: the best and those within its noise;
    ``only``: a single point to choose from; ``none``: no point fits (or every one was left out)."""

    kind: str
    best: Candidate | None = None
    tied: list[Candidate] = field(default_factory=list)
    excluded: list[Candidate] = field(default_factory=list)  # oversubscribed points: never a winner

    @property
    def coverages(self) -> list[float]:
        return [c.coverage for c in ([self.best] if self.kind != "tied" else self.tied) if c and c.coverage]


def candidate(row: dict, name: str) -> Candidate | None:
    """The Candidate of a tidy row, or None when it has no throughput."""
    tok, step = row.get("tok_s"), row.get("step_s")
    if not finite_number(tok) or tok <= 0:
        return None
    lo, hi, cov = row.get("step_ci_lo"), row.get("step_ci_hi"), row.get("step_ci_cov")
    if finite_number(step) and finite_number(lo) and finite_number(hi) and lo > 0:
        tokens = tok * step  # tokens per step
        return Candidate(name, tok, tokens / hi, tokens / lo, cov if finite_number(cov) else None, row)
    return Candidate(name, tok, None, None, None, row)


def fastest(candidates: list[Candidate], left_out=lambda c: False) -> Answer:
    """Which candidate is fastest, if the intervals can tell (see the module's text); `left_out` says which
    may not win (a point that ran oversubscribed on a loaded machine)."""
    excluded = [c for c in candidates if left_out(c)]
    pool = sorted((c for c in candidates if not left_out(c)), key=lambda c: -c.tok_s)
    if not pool:
        return Answer("none", excluded=excluded)
    best = pool[0]
    if len(pool) == 1:
        return Answer("only", best, [best], excluded)
    tied = [best] + [c for c in pool[1:] if not (best.has_interval and c.has_interval and c.high < best.low)]
    return Answer("winner" if len(tied) == 1 else "tied", best, tied, excluded)


def _samples(row: dict) -> list:
    """What a point's time interval is over (:func:`.tables._samples`)."""
    from .tables import _samples as samples

    return samples(row.get("step_times"), row.get("repeat_medians"))


def fmt_tok(c: Candidate) -> str:
    """"1,234 tokens/s [1,200, 1,260] (97.85 % interval)", or without an interval "(no interval: n < 3)"."""
    if not c.has_interval:
        return f"{c.tok_s:,.0f} tokens/s (too few steps for an interval)"
    return f"{c.tok_s:,.0f} tokens/s [{c.low:,.0f}, {c.high:,.0f}] ({coverage_label(c.coverage)} interval)"


_no_checkpointing = no_checkpointing


def against_none(row: dict, group: pd.DataFrame) -> str:
    """Peak saving and step-time ratio of a point (a tidy row) against no checkpointing at its batch and
    setup (:func:`.columns.setup_of`: LoRA's or an optimizer's own saving is not checkpointing's)."""
    if _no_checkpointing(row.get("strategy")):
        return "is no checkpointing"
    setup = setup_of(row.get("strategy"))
    base = group[group["strategy"].map(_no_checkpointing).astype(bool) & (group["batch"] == row.get("batch"))
                 & (group["strategy"].map(setup_of) == setup)]
    if base.empty:
        return (f"no ok 'none{'+' + setup if setup else ''}' point at batch {row.get('batch', 0):.0f} "
                "to compare with")
    b = base.iloc[0].to_dict()
    parts = []
    if finite_number(row.get("peak")) and finite_number(b.get("peak")) and b["peak"] > 0:
        saved = (1 - row["peak"] / b["peak"]) * 100
        parts.append(f"{abs(saved):.1f} % {'less' if saved >= 0 else 'more'} peak memory")
    if finite_number(row.get("step_s")) and finite_number(b.get("step_s")) and b["step_s"] > 0:
        ci = ratio_ci(_samples(row), _samples(b))
        interval = (f" [{ci.low:.2f}×, {ci.high:.2f}×] (≥ {coverage_label(ci.coverage)} interval)" if ci else "")
        parts.append(f"step time {row['step_s'] / b['step_s']:.2f}×{interval}")
    return ", ".join(parts) or "–"


def describe(answer: Answer, group: pd.DataFrame) -> tuple[str, str, str]:
    """(answer, value, against none) as the headline's cells say them."""
    left_out = (f"; left out, oversubscribed on a loaded machine: {', '.join(c.name for c in answer.excluded)}"
                if answer.excluded else "")
    if answer.kind == "none":
        return ("no measured point fits" if not answer.excluded else "no point that can be trusted fits") + left_out, \
            "–", "–"
    best = answer.best
    if answer.kind in ("winner", "only"):
        short = [c for c in answer.coverages if c < LEVEL]
        caveat = (f"; intervals of {coverage_label(min(short))}: too few steps for a 95 % call" if short and
                  answer.kind == "winner" else "")
        label = best.name + (" (the only point)" if answer.kind == "only" else "")
        return label + caveat + left_out, fmt_tok(best), against_none(best.row, group)
    names = ", ".join(c.name for c in answer.tied)
    versus = "; ".join(f"{c.name}: {against_none(c.row, group)}" for c in answer.tied[:TIED_SHOWN])
    if len(answer.tied) > TIED_SHOWN:
        versus += f"; and {len(answer.tied) - TIED_SHOWN} more"
    return (f"tied within noise: {names}" + left_out, f"best median {fmt_tok(best)}", versus)


def short_name(row: dict, many_batches: bool) -> str:
    return f"{row['strategy']}" + (f" · batch {row['batch']:.0f}" if many_batches else "")


@dataclass
class GroupAnswers:
    """One (variant, sequence length) group's answers: its lowest-peak point and, per budget, the fastest
    setting that fits (or the tie).  ``rows`` are the group's ok records as dicts; ``frame()`` is the tidy
    slice, taken only when a caller sets a point against no checkpointing (20,000 slices cost seconds)."""

    variant: str
    seq: float
    where: str
    many_batches: bool
    rows: list[dict]
    lowest: dict | None
    fastest: list[tuple[str, float | None, Answer]]  # (budget label, budget bytes or None, answer)
    _ok: pd.DataFrame = field(repr=False, default=None)
    _at: object = field(repr=False, default=None)

    def frame(self) -> pd.DataFrame:
        return self._ok.iloc[self._at]

    def name(self, row: dict) -> str:
        return short_name(row, self.many_batches)


def group_answers(t: pd.DataFrame, budgets: list[tuple[str, float | None]]) -> list[GroupAnswers]:
    """Per (variant, sequence length), in that order: the lowest peak and each budget's answer.  Each budget
    is (its label, bytes or None for no budget)."""
    ok = t[t["ok"]]
    out = []
    many_variants = ok["variant"].nunique() > 1
    flags = oversubscribed_rows(ok)
    every = ok.to_dict("records")  # once: a large run's frame is wide, and converting it is most of the time
    for (variant, seq), at in sorted(ok.groupby(["variant", "seq"]).indices.items()):
        records = [every[i] for i in at]
        many_batches = len({r["batch"] for r in records}) > 1
        where = f"seq {seq:.0f}" + (f" · {variant}" if many_variants else "")
        peaks = [r for r in records if finite_number(r.get("peak"))]
        lowest = min(peaks, key=lambda r: r["peak"]) if peaks else None
        fast = []
        for label, limit in budgets:
            within = [r for r in records if limit is None or (finite_number(r.get("peak")) and r["peak"] <= limit)]
            cands = [c for c in (candidate(r, short_name(r, many_batches)) for r in within) if c is not None]
            fast.append((label, limit, fastest(cands, lambda c: flags.get(c.row.get("case_id"), False))))
        out.append(GroupAnswers(variant, seq, where, many_batches, records, lowest, fast, ok, at))
    return out


def answers(t: pd.DataFrame, budgets: list[tuple[str, float | None]]) -> list[dict]:
    """One row per (variant, sequence length, question): the lowest peak, then per budget the fastest
    setting that fits, or the tie."""
    rows = []
    for g in group_answers(t, budgets):
        group = g.frame()
        if g.lowest is not None:
            rows.append({"question": f"{g.where}: lowest peak memory", "answer": g.name(g.lowest),
                         "value": _bytes(g.lowest["peak"]), "against": against_none(g.lowest, group)})
        for label, _, answer in g.fastest:
            text, value, against = describe(answer, group)
            rows.append({"question": f"{g.where}: fastest{label}", "answer": text, "value": value, "against": against})
    return rows


def budgets_of(budgets_gib: tuple[float, ...]) -> list[tuple[str, float | None]]:
    """No budget, then each of a suite's budgets (``[suite] budgets_gib``), as :func:`answers` takes them."""
    return [("", None)] + [(f" within {b:g} GiB", b * GIB) for b in budgets_gib]


def headline(t: pd.DataFrame, budgets_gib: tuple[float, ...]) -> list[dict]:
    """The report's headline rows: per sequence length, no budget and each of the suite's budgets."""
    return answers(t, budgets_of(budgets_gib))


def summary_lines(records: list[dict], budgets: list[tuple[str, float | None]]) -> list[str]:
    """The fastest answers of the headline as plain lines (a sweep's console summary, plan --verify)."""
    from .columns import record_frame, tidy

    ok = [r for r in records if r.get("status") == "ok"]
    if not ok:
        return []
    rows = answers(tidy(record_frame(ok)), budgets)
    return [f"{r['question']}: {r['answer']} — {r['value']}" + (f"; {r['against']}" if r["against"] != "–" else "")
            for r in rows if ": fastest" in r["question"]]


def oversubscribed_rows(t: pd.DataFrame) -> dict:
    """case_id -> whether the point ran oversubscribed on a loaded machine."""
    return {row["case_id"]: _load(row)["oversubscribed"] for row in _columns(t, "case_id", *LOAD_COLUMNS)}


LOAD_COLUMNS = ("load_average", "cpu_count", "threads", "cores_seen", "device")


def _columns(t: pd.DataFrame, *names: str) -> list[dict]:
    """The rows of `t` as dicts of the named columns it has (a large run's frame is too wide to convert
    whole for a few of its columns)."""
    return t[[n for n in names if n in t.columns]].to_dict("records")


def _load(row: dict) -> dict:
    return load_state(row.get("load_average"), row.get("cpu_count"), row.get("threads"), row.get("cores_seen"),
                      row.get("device") or "cpu")


def _bytes(value: float) -> str:
    from .tables import fmt_bytes

    return fmt_bytes(value)


def load_note(t: pd.DataFrame) -> dict | None:
    """What the machine's load did to the timing: how many points ran while it was loaded (load average
    above its cores), the median relative width of their intervals beside the others', and the points that
    ran oversubscribed.  None when no record says its load."""
    ok = _columns(t[t["ok"]], *LOAD_COLUMNS, "step_ci_lo", "step_ci_hi", "step_s", "strategy", "batch", "seq")
    states = [(r, _load(r)) for r in ok]
    known = [(r, s) for r, s in states if s["loaded"] is not None]
    if not known:
        return None

    def width(rows):
        w = [(r["step_ci_hi"] - r["step_ci_lo"]) / r["step_s"] for r in rows
             if all(finite_number(r.get(k)) for k in ("step_ci_lo", "step_ci_hi", "step_s")) and r["step_s"] > 0]
        return sorted(w)[len(w) // 2] if w else None

    loaded = [r for r, s in known if s["loaded"]]
    calm = [r for r, s in known if not s["loaded"]]
    over = [f"{r['strategy']} · batch {r['batch']:.0f} · seq {r['seq']:.0f}" for r, s in known if s["oversubscribed"]]
    peak = max(s["load_1m"] for _, s in known)
    return {"points": len(known), "loaded": len(loaded), "width_loaded": width(loaded), "width_calm": width(calm),
            "oversubscribed": over, "max_load": peak, "cores": max(s["cores"] for _, s in known)}


def load_text(note: dict | None) -> str:
    """The note as one paragraph."""
    if not note:
        return ""
    if not note["loaded"]:
        return (f"The machine was not loaded while these points ran (load average at most {note['max_load']:.2f} on "
                f"{note['cores']} cores).")

    def pct(value):
        return "–" if value is None else f"{value * 100:.1f} %"

    calm = (f"against {pct(note['width_calm'])} for the points run while it was not" if note["width_calm"] is not None
            else "with no point run on the calm machine to set it against")
    text = (f"The machine was loaded (load average above its {note['cores']} cores, up to {note['max_load']:.2f}) "
            f"while {note['loaded']} of {note['points']} points ran: the median width of their step-time intervals "
            f"was {pct(note['width_loaded'])} of the median, {calm}.")
    if note["oversubscribed"]:
        text += (f" {len(note['oversubscribed'])} ran as many threads as their cores while loaded (OpenMP's threads "
                 "then wait at every barrier for a descheduled one) and are never named fastest: "
                 + ", ".join(note["oversubscribed"][:8]) + (" …" if len(note["oversubscribed"]) > 8 else "") + ".")
    return text
