"""``plan --optimize --verify``: the optimum, the best ranked strategy and (when it is another) the best
every-n strategy, run here as an ordinary sweep.

Every point is predicted before any runs (nothing is fitted to them); the table sets each one's measured
peak and tokens/s (with the sweep's interval) beside its prediction, and says whether the optimum's measured
tokens/s is above each strategy's, tied with it within their intervals, or below.
"""

from __future__ import annotations

import dataclasses
import os

GIB = 2**30


def _interval(m, tokens: int) -> tuple[float, float, float] | None:
    """(median, low, high) tokens/s of a measurement (:class:`~ckptbench.store.schema.Measurement`)."""
    median, ci = m.step_time_median_s, m.step_time_ci95_s
    if not median:
        return None
    lo, hi = (ci if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(ci) else (median, median))
    return tokens / median, tokens / hi, tokens / lo


def compared(ranked, every_n) -> list[tuple[str, object]]:
    """The strategies the optimum is measured against: the best ranked one and, when it is another, the best
    every-n one (what ``gradient_checkpointing_kwargs={"every_n_layers": k}`` can say)."""
    out = [] if ranked is None else [("ranked", ranked)]
    if every_n is not None and (ranked is None or (every_n.strategy, every_n.max_batch)
                                != (ranked.strategy, ranked.max_batch)):
        out.append(("every-n", every_n))
    return out


def verdict(mine: tuple[float, float, float], theirs: tuple[float, float, float]) -> str:
    """Faster, slower or tied: (median, low, high) tokens/s each; tied when the intervals overlap."""
    return ("faster than" if mine[1] > theirs[2] else "slower than" if mine[2] < theirs[1]
            else "tied within the intervals with")


def verify_optimum(args, case, a, predict, best, ranked, out: str, budgets: list[float] = (),
                   every_n=None) -> int:
    from ..point.strategy import checkpointed_layers
    from ..run.sweep import SweepOptions, run_sweep
    from ..store.records import load_records
    from ..store.schema import EMPTY, typed
    from ..suite.parse import parse_suite
    from ..theory.verdicts.annotate import annotate_record
    from .handover import policy_name as _name
    from .handover import suite_file
    from .quick import model_lines, train_lines

    with open(os.path.join(out, "optimum.toml"), encoding="utf-8") as fh:
        suite = parse_suite(fh.read(), "plan --optimize --verify")
    points = {suite.cases[0].id: (f"optimum {_name(best)}", best.peak_bytes, best.tokens_per_s)}
    cases = [suite.cases[0]]
    for tag, option in compared(ranked, every_n):
        layers = option.layers or tuple(checkpointed_layers(case.model.layers, option.every_n_layers))
        text = suite_file("plan-optimum", suite.cases[0].device, model_lines(args.model, layers=args.layers,
                          precision=case.precision, attn=case.model.attn), train_lines(args), option.max_batch,
                          case.seq_len, layers, option.offload, option.sac,
                          every_n=None if option.layers else option.every_n_layers)
        other = parse_suite(text, "plan --optimize --verify").cases[0]
        other = dataclasses.replace(other, recompute=dataclasses.replace(other.recompute,
                                                                         offload=option.offload_kind))
        if other.id not in points:
            cases.append(other)
            points[other.id] = (f"{tag} {option.strategy}", option.peak_bytes, option.tokens_per_s)

    if budgets:  # torch.compile at each budget, at the optimum's batch: measured, never predicted
        text = suite_file("plan-optimum", suite.cases[0].device, model_lines(args.model, layers=args.layers,
                          precision=case.precision, attn=case.model.attn), train_lines(args), best.batch,
                          case.seq_len, (), False, "").replace("every_n_layers = [0]", "every_n_layers = [0]\n"
                                                                f"compile_budget = {list(budgets)}")
        for c in parse_suite(text, "plan --optimize --verify").cases:
            if c.compiled:
                cases.append(c)
                points[c.id] = (f"compile-budget-{c.recompute.compile_budget:g}", None, None)

    def annotate(c, record):
        annotate_record(c, record)
        label, peak, tokens = points[c.id]
        if peak is None:
            return
        record["plan_prediction"] = {"peak_bytes": peak, "tokens_per_s": tokens, "source": predict.source,
                                     "step_time_source": a.step_time_source, "policy": label}

    run_sweep(dataclasses.replace(suite, cases=tuple(cases)), SweepOptions(out_dir=out), annotate=annotate)
    records = {r.case_id: r for r in typed(load_records(out).records)}
    print(f"\nverify ({out}): predicted vs measured on this machine, neither point used to predict")
    print(f"{'point':<40} {'batch':>5} {'peak pred GiB':>13} {'peak meas GiB':>13} {'tok/s pred':>10} "
          f"{'tok/s meas [interval]':>28}  status")
    seen = {}
    for c in cases:
        r = records.get(c.id)
        label, peak, tokens = points[c.id]
        m, status = (r.measurement, r.status) if r else (EMPTY, "missing")
        iv = _interval(m, c.batch_size * c.seq_len) if status in ("ok", "unchecked") else None
        seen[label.split()[0]] = iv
        measured = "-" if iv is None else f"{iv[0]:,.0f} [{iv[1]:,.0f}, {iv[2]:,.0f}]"
        print(f"{label:<40} {c.batch_size:>5} {'-' if peak is None else f'{peak / GIB:.4f}':>13} "
              f"{(m.peak_bytes or 0) / GIB:>13.4f} {'-' if tokens is None else f'{tokens:,.0f}':>10} "
              f"{measured:>28}  {status}"
              + (f" (measured peak {'=' if m.peak_bytes == peak else '≠'} predicted)"
                 if m.peak_bytes and peak is not None else ""))
    mine = seen.get("optimum")
    for tag, name in (("ranked", "the best ranked strategy"), ("every-n", "the best every-n strategy")):
        theirs = seen.get(tag)
        if mine and theirs:
            print(f"measured: the optimum is {verdict(mine, theirs)} {name} ({mine[0] / theirs[0] - 1:+.1%} at the "
                  "medians)")
    curve = [(c.recompute.compile_budget, *((r.status, r.measurement) if (r := records.get(c.id)) else
                                            ("missing", EMPTY))) for c in cases if c.compiled]
    if curve:
        print(compile_curve(curve, a.memory_bytes, mine))
    return 0 if mine else 1


def compile_curve(curve: list[tuple], memory: int, optimum) -> str:
    """The measured peak and tokens/s of each compile budget (budget, status, measurement), in budget order,
    and where the peak is not monotonic in the budget (it is not assumed to be: pytorch#197838)."""
    peaks = [(m.peak_bytes, b) for b, _, m in curve]
    known = [(p, b) for p, b in peaks if p]
    falls = [f"{b0:g}→{b1:g}" for (p0, b0), (p1, b1) in zip(known, known[1:]) if p1 < p0]
    parts = []
    for b, status, m in curve:
        tps = f"{m.tokens_per_s:,.0f} tokens/s" if m.tokens_per_s else status
        fits = "" if not m.peak_bytes else " (fits)" if m.peak_bytes <= memory else " (over the budget)"
        parts.append(f"{b:g}: {(m.peak_bytes or 0) / GIB:.4f} GiB{fits}, {tps}")
    line = "compile budgets, measured: " + "; ".join(parts)
    line += (f"; the peak falls as the budget rises at {', '.join(falls)}: not monotonic" if falls
             else "; the peak did not fall as the budget rose at these budgets")
    if optimum:
        line += f"; the optimum measured {optimum[0]:,.0f} tokens/s"
    return line
