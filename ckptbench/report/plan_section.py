"""The report's "Plan" section: what ``ckptbench plan`` predicted for this run, beside what was measured.

``plan --verify`` stores the plan as ``plan.json`` in the results directory it runs into, and ``sweep --plan
FILE`` copies a ``plan --json`` output there; a report of that directory charts every strategy's largest batch and predicted tokens/s (the recommendation highlighted)
and sets each measured point beside the planner's prediction for it.
"""

from __future__ import annotations

import json
import os

import matplotlib.pyplot as plt

from ..base.regularfile import open_regular
from ..spec.setup import precision_name
from .figures import STYLE, Figure, _encode

PLAN_FILE = "plan.json"


def load_plan(run_dir: str) -> dict | None:
    path = os.path.join(run_dir, PLAN_FILE)
    if not os.path.exists(path):
        return None
    with open_regular(path, "r", encoding="utf-8") as fh:
        return json.load(fh)


def plan_figure(plan: dict, shown: int = 16) -> Figure | None:
    """Largest batch (bars) and predicted tokens/s (points) per strategy, the fastest first."""
    from matplotlib.ticker import MaxNLocator

    options = [o for o in plan.get("rows", plan["options"]) if o["max_batch"]][:shown]
    if not options:
        return None
    names = [o["strategy"] for o in options]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(names) + 2), 4.0))
        colors = ["#d62728" if k == 0 else "#7f7f7f" for k in range(len(names))]
        ax.bar(range(len(names)), [o["max_batch"] for o in options], color=colors)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right")
        ax.set_ylabel("largest batch that fits")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # batches are whole numbers
        tps = ax.twinx()
        tps.plot(range(len(names)), [o["tokens_per_s"] or 0 for o in options], "o", color="black")
        tps.set_ylabel("predicted tokens/s")
        tps.set_ylim(bottom=0)  # from zero: a 1 % difference looks like one
        uri = _encode(fig)
    return Figure("Plan: largest batch and predicted tokens/s per strategy", uri,
                  "bars: largest fitting batch per strategy; points: predicted tokens/s",
                  f"Fastest first; the recommendation is red. {plan['recommendation']}")


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
    for r in records:
        c, m = r.get("case") or {}, r.get("measurement") or {}
        p = r.get("plan_prediction")
        if not p and plan and not _same_setup(plan, c):
            continue  # a plan for another precision or loop predicted nothing about this point
        if not p:
            o = by_point.get((r.get("strategy"), c.get("batch_size"), c.get("seq_len")))
            p = o and {"peak_bytes": o.get("peak_bytes"), "tokens_per_s": o.get("tokens_per_s")}
        if not p or r.get("status") != "ok":
            continue
        rows.append({"point": f"{r['strategy']} b={c['batch_size']}",
                     "peak_pred": p.get("peak_bytes"), "peak_meas": m.get("peak_bytes"),
                     "tps_pred": p.get("tokens_per_s"), "tps_meas": m.get("tokens_per_s")})
    return rows


def _where(plan: dict) -> str:
    """The memory planned for and where: "79.19 GiB on NVIDIA H100 80GB HBM3 × 8 ranks"."""
    a = plan.get("assumptions") or {}
    memory = a.get("memory_bytes")
    where = f"{memory / 2**30:.2f} GiB" if isinstance(memory, (int, float)) else "memory not stated"
    where += f" on {a.get('device_name') or a.get('device') or 'an unnamed device'}"
    world = a.get("world") or 1
    return where + (f" × {world} ranks ({a.get('sharding', 'ddp')})" if world > 1 else "")


def plan_page(plan: dict) -> str:
    """A plan on its own, as one self-contained HTML page: the chart, every strategy, the assumptions."""
    from html import escape

    fig = plan_figure(plan)
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
            + (f"<img alt='{escape(fig.alt)}' src='{fig.uri}'>" if fig else "")
            + "<table><tr><th>strategy</th><th>max batch</th><th>max seq @b1</th><th>peak GiB</th>"
            "<th>step s</th><th>tokens/s</th></tr>" + rows + "</table>" + left_out
            + f"<p>Memory and FLOPs: {escape(str(plan.get('memory_source', '')))}</p>"
            + (f"<p>Step time: {escape(str(timed))}</p>" if timed
               else "<p>Step time: none predicted (no setting fits).</p>") + f"<ul>{sources}</ul>"
            "<p>Predicted, not measured: <code>ckptbench plan --verify</code> or a sweep with "
            "<code>--plan</code> measures it.</p></body></html>")
