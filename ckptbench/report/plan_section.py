"""The report's "Plan" section: what ``ckptbench plan`` predicted for this run, beside what was measured.

``plan --verify`` stores the plan as ``plan.json`` in the results directory it runs into, and ``sweep --plan
FILE`` copies a ``plan --json`` output there; a report of that directory charts every strategy's largest batch and predicted tokens/s (the recommendation highlighted)
and sets each measured point beside the planner's prediction for it.
"""

from __future__ import annotations

import json
import os

from ..base.regularfile import open_regular
from ..point.setup import precision_name
from ..store.schema import typed
from .figures import Figure

PLAN_FILE = "plan.json"


def load_plan(run_dir: str) -> dict | None:
    path = os.path.join(run_dir, PLAN_FILE)
    if not os.path.exists(path):
        return None
    with open_regular(path, "r", encoding="utf-8") as fh:
        return json.load(fh)


def _name(strategy: str, batch) -> str:
    return f"{strategy} · batch {batch}"


def plan_figure(plan: dict, records: list[dict] | None = None) -> Figure | None:
    """The headline's picture for a plan: each ranked strategy at its largest batch as a predicted point of
    peak memory against tokens/s, the frontier, the memory planned for as the budget line, the
    recommendation starred; with `records` (``--verify``'s), each measured point beside its prediction."""
    from .frontier import Panel, Point, figure

    options = [o for o in plan.get("rows", plan["options"])
               if o.get("max_batch") and o.get("tokens_per_s") and o.get("peak_bytes")]
    if not options:
        return None
    points = [Point(_name(o["strategy"], o["max_batch"]), o["strategy"], float(o["peak_bytes"]),
                    float(o["tokens_per_s"])) for o in options]
    memory = (plan.get("assumptions") or {}).get("memory_bytes")
    budgets = [(f"{memory / 2**30:.2f} GiB planned for", float(memory))] if isinstance(memory, (int, float)) else []
    overlay = [Point(_name(r["strategy"], r["batch"]), "measured",
                     float(r["peak_meas"]), float(r["tps_meas"]))
               for r in predicted_vs_measured(records or [], plan) if r["peak_meas"] and r["tps_meas"]]
    panel = Panel(f"{plan.get('model') or 'plan'}, seq {plan.get('seq_len')}", points, budgets,
                  {points[0].name: ["recommended"]}, overlay)
    measured = f"; ✕ marks {len(overlay)} measured point(s), joined to their predictions" if overlay else ""
    alt = (f"Predicted tokens/s against predicted peak memory for {len(points)} strategies at their largest "
           f"batch, the frontier as a staircase, the memory planned for as a dashed line, the recommendation "
           f"({points[0].name}) starred{measured}.")
    caption = ("Predicted, each strategy at the largest batch that fits; the staircase is the frontier (left of "
               "the memory line, its highest step is the fastest that fits). " + plan["recommendation"]
               + (" Measured points (✕) are --verify's, dotted to the prediction they check." if overlay else ""))
    return figure([panel], "Plan: predicted tokens/s against predicted peak memory", alt, caption)


def _same_setup(plan: dict, case: dict) -> bool:
    """Whether a plan (which names its precision and loop since they exist) is about this point's setup."""
    setup = case.get("setup") or {}
    autocast = setup.get("autocast") or ""
    precision = precision_name((case.get("model") or {}).get("dtype"), autocast)
    return (plan.get("precision", precision) == precision
            and plan.get("loop", "manual") == (setup.get("loop") or "manual"))


def predicted_vs_measured(records: list[dict], plan: dict | None = None) -> list[dict]:
    """Each measured point the plan made a prediction for.

    ``plan --verify`` keeps its prediction in each record (``plan_prediction``).  An ordinary sweep run
    with ``--plan FILE`` (a ``plan --json`` output) keeps the plan beside its records: the plan predicted
    each strategy at its largest batch and the asked sequence length, so a record at that strategy, batch
    and length is set beside it; other points had no prediction and are not shown.
    """
    by_point = {}
    if plan:
        seq = plan.get("seq_len")
        for o in plan.get("options", []):
            if o.get("max_batch"):  # by the strategy's name: a SAC policy or streamed offload shares its n
                by_point[(o.get("strategy"), o["max_batch"], seq)] = o
    rows = []
    for r in typed(records):
        c, m, p = r.case, r.measurement, r.plan_prediction
        if not p and plan and not _same_setup(plan, r.case_fields):
            continue  # a plan for another precision or loop predicted nothing about this point
        if not p:
            o = by_point.get((r.strategy, c.batch_size, c.seq_len))
            p = o and {"peak_bytes": o.get("peak_bytes"), "tokens_per_s": o.get("tokens_per_s")}
        if not p or not r.ok:
            continue
        rows.append({"point": f"{r.strategy} b={c.batch_size}", "strategy": r.strategy, "batch": c.batch_size,
                     "peak_pred": p.get("peak_bytes"), "peak_meas": m.peak_bytes,
                     "tps_pred": p.get("tokens_per_s"), "tps_meas": m.tokens_per_s})
    return rows


def _where(plan: dict) -> str:
    """The memory planned for and where: "79.19 GiB on NVIDIA H100 80GB HBM3 × 8 ranks"."""
    a = plan.get("assumptions") or {}
    memory = a.get("memory_bytes")
    where = f"{memory / 2**30:.2f} GiB" if isinstance(memory, (int, float)) else "memory not stated"
    where += f" on {a.get('device_name') or a.get('device') or 'an unnamed device'}"
    world = a.get("world") or 1
    return where + (f" × {world} ranks ({a.get('sharding', 'ddp')})" if world > 1 else "")


def plan_page(plan: dict, records: list[dict] | None = None) -> str:
    """A plan on its own, as one self-contained HTML page: the chart, every strategy, the assumptions; with
    `records` (``--verify``'s), the measured points drawn beside their predictions."""
    from html import escape

    fig = plan_figure(plan, records)
    gib = 2**30
    def cell(value, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    rows = "".join(
        f"<tr{' class=best' if k == 0 and o['max_batch'] else ''}><td>{escape(o['strategy'])}</td>"
        f"<td>{o['max_batch']}</td><td>{cell(o['max_seq'], 'd')}</td>"
        f"<td>{cell(None if o['peak_bytes'] is None else o['peak_bytes'] / gib, '.2f')}</td>"
        f"<td>{cell(o['step_s'], '.3f')}</td><td>{cell(o['tokens_per_s'], ',.0f')}</td></tr>"
        for k, o in enumerate(plan.get("rows", plan["options"])))
    sources = "".join(f"<li>{escape(str(k))}: {escape(str(v))}</li>"
                      for k, v in (plan["assumptions"].get("sources") or {}).items())
    timed = plan["assumptions"].get("step_time_source")
    left_out = plan.get("not_ranked")  # what the plan did not rank, and why (plans since SAC and streamed offload)
    left_out = ("<p>Not ranked:</p><ul>" + "".join(f"<li>{escape(str(k))}: {escape(str(v))}</li>"
                                                   for k, v in left_out.items()) + "</ul>"
                if isinstance(left_out, dict) and left_out else "")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>Plan: {escape(str(plan.get('model')))}</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}"
            "td:first-child{text-align:left}.best{background:#fde0dc;font-weight:bold}</style></head><body>"
            f"<h1>Plan: {escape(str(plan.get('model')))} at seq {plan.get('seq_len')}, {escape(_where(plan))}</h1>"
            f"<p><strong>Recommended:</strong> {escape(plan['recommendation'])}</p>"
            + (f"<figure><img style='max-width:100%;height:auto' alt='{escape(fig.alt)}' src='{fig.uri}'>"
               f"<figcaption>{escape(fig.caption)}</figcaption></figure>" if fig else "")
            + "<table><tr><th>strategy</th><th>max batch</th><th>max seq @b1</th><th>peak GiB</th>"
            "<th>step s</th><th>tokens/s</th></tr>" + rows + "</table>" + left_out
            + f"<p>Memory and FLOPs: {escape(str(plan.get('memory_source', '')))}</p>"
            + (f"<p>Step time: {escape(str(timed))}</p>" if timed
               else "<p>Step time: none predicted (no setting fits).</p>") + f"<ul>{sources}</ul>"
            "<p>Predicted, not measured: <code>ckptbench plan --verify</code> or a sweep with "
            "<code>--plan</code> measures it.</p></body></html>")
