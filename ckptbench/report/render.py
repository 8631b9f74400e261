"""Render one results directory into one self-contained HTML file.

The report is built from the records alone (``store.records.load_records`` → ``columns.record_frame``
→ the tidy frame of :mod:`.columns`) plus the suite file stored beside them, so a report can be re-rendered at any
time from ``results/<run>/``.  A report is what people read when something went wrong, so rendering never
fails on bad data: unreadable lines, an empty file or a section that cannot be drawn become visible notes
in the report instead of a traceback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import jinja2

from ..base.regularfile import open_regular
from ..store.files import remove_quietly, write_text_atomic
from ..store.records import load_records
from ..theory.memory.simulated import beside_measurements, load_simulated
from . import (
    answers_table,
    check_format,
    checks,
    env_table,
    figures,
    frontier,
    headline,
    localsgd_quality,
    loss_curves,
    network_section,
    plan_section,
    scatters,
    tables,
    timeline,
)
from .columns import record_frame, strategies, tidy

SUITE_FILE = "suite.toml"
TEMPLATES = os.path.join(os.path.dirname(__file__), "templates")

# (anchor, heading).  The template renders them in this order; the contents list marks absent ones.
SECTIONS = (
    ("headline", "Headline"),
    ("memory", "Memory vs sequence length and batch size"),
    ("pareto", "Time vs memory"),
    ("checks", "Estimate checks"),
    ("breakdown", "Memory breakdown"),
    ("timeline", "Memory timeline"),  # left out of the contents too when no record has a timeline
    ("localsgd", "Local SGD"),
    ("plan", "Plan"),
    ("failures", "Failures"),
    ("baseline", "Changes vs baseline"),
    ("environment", "Environment"),
)


@dataclass
class SuiteInfo:
    text: str | None = None
    budgets_gib: tuple[float, ...] = ()
    note: str = ""


@dataclass
class Context:
    """Everything the template shows; sections read only from here."""

    title: str
    run_dir: str
    problems: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    present: dict = field(default_factory=dict)
    tidy: object = None  # the tidy records frame the sections were built from (the CSV is written from it)
    groups: list = field(default_factory=list)  # the headline's answers per group (the answers CSV)


def read_suite(run_dir: str) -> SuiteInfo:
    """The suite file the sweep stored beside its records, and the memory budgets it names."""
    path = os.path.join(run_dir, SUITE_FILE)
    if not os.path.exists(path):
        return SuiteInfo(note=f"suite file not stored with this run (no {SUITE_FILE} in the results "
                              "directory); memory budgets unknown")
    try:
        with open_regular(path, "r", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as exc:
        return SuiteInfo(note=f"{SUITE_FILE} could not be read: {exc}")
    from ..suite.keys import SuiteError
    from ..suite.parse import parse_suite

    try:
        suite = parse_suite(text, path)
    except SuiteError as exc:
        return SuiteInfo(text=text, note=f"{SUITE_FILE} is not a valid suite ({exc}); budgets unknown")
    return SuiteInfo(text=text, budgets_gib=suite.budgets_gib)


def _guard(ctx: Context, name: str, fn, default=None):
    """Run one section's builder; a failure becomes a note in the report, never a traceback."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the report must still render; the note says what broke
        ctx.problems.append(f"section '{name}' could not be rendered: {type(exc).__name__}: {exc}")
        return default


def _load(path: str, loaded=None):
    loaded = loaded if loaded is not None else load_records(path)
    frame = record_frame(loaded.records)
    t = tidy(frame) if len(frame) else None
    return loaded, frame, t


def build_context(run_dir: str, baseline_dir: str | None = None, loaded=None) -> Context:
    """Everything the page shows; `loaded` when the caller read the records already (the CLI does)."""
    ctx = Context(title=os.path.basename(os.path.normpath(run_dir)) or run_dir, run_dir=run_dir)
    loaded, frame, t = _load(run_dir, loaded)
    ctx.tidy = t
    ctx.problems.extend(loaded.notes())
    suite = _guard(ctx, "suite file", lambda: read_suite(run_dir), SuiteInfo(note="suite file unreadable"))
    d = ctx.data
    d["suite"] = suite
    d["n_records"] = len(loaded.records)
    d["env"] = _guard(ctx, "environment", lambda: env_table.environment_table(
        frame, checks.settings(t) if t is not None else None), env_table.EnvTable())
    if t is None:
        ctx.problems.append("no readable records: nothing was measured, or the records file is empty "
                            "or unreadable" if not loaded.problems else
                            "no readable records remain after skipping the lines listed above")
        ctx.present = {"environment": True}
        return ctx
    suites = sorted(set(t["suite"]) - {""})
    if suites:
        ctx.title = f"{', '.join(suites)} — {ctx.title}"
    d["statuses"] = tables.status_counts(t)
    d["strategies"] = strategies(t)
    finished = frame["finished_at"].dropna().astype(str) if "finished_at" in frame.columns else []
    d["finished"] = (min(finished), max(finished)) if len(finished) else None

    ctx.groups = _guard(ctx, "headline", lambda: headline.group_answers(t, headline.budgets_of(suite.budgets_gib)), [])
    d["headline_fig"] = _guard(ctx, "headline figure", lambda: frontier.headline_figure(ctx.groups))
    d["headline"], d["headline_total"] = _guard(ctx, "headline", lambda: answers_table.distinct_rows(ctx.groups),
                                                ([], 0))
    d["answers_csv"] = None
    d["load"] = _guard(ctx, "headline", lambda: headline.load_text(headline.load_note(t)), "")
    d["savings"] = _guard(ctx, "headline", lambda: tables.savings(t), [])
    d["offload_notes"] = tables.offload_notes(t)

    single = t[~(t["world"] > 1)]
    d["memory_figs"] = _guard(ctx, "memory", lambda: figures.checkpointing_figures(single), [])
    d["pareto_figs"] = [f for f in (_guard(ctx, "pareto", lambda fn=fn: fn(single)) for fn in
                                    (scatters.pareto, scatters.step_time_pareto)) if f is not None]
    table = _guard(ctx, "checks", lambda: checks.check_table(t), checks.CheckTable())
    d["checks"], d["check_summary"] = table.rows, table.summary
    d["checks_total"], d["checks_failing"], d["checks_all_listed"] = table.total, table.failing, table.all_listed
    d["checks_csv"] = None
    d["record_verdicts"] = tables.record_verdicts(frame)
    d["simulated"] = _guard(ctx, "simulated", lambda: beside_measurements(loaded.records, load_simulated(run_dir)), [])
    d["simulated_fig"] = _guard(ctx, "simulated", lambda: scatters.estimate_vs_measured(
        [{"quantity": "peak_bytes (simulated)", "measured": r["measured"], "estimated": r["simulated"]}
         for r in d["simulated"]], title="Measured vs simulated", estimate_label="simulated"))
    d["check_fig"] = _guard(ctx, "checks", lambda: scatters.estimate_vs_measured(table.points))
    d["breakdown_fig"] = _guard(ctx, "breakdown", lambda: figures.breakdown(single))
    d["timeline_figs"], d["timeline_note"] = _guard(ctx, "timeline", lambda: timeline.timeline_figures(
        loaded.records, t, run_dir), ([], ""))
    d["localsgd"] = _guard(ctx, "local SGD", lambda: tables.local_sgd_rows(t), [])
    d["comm_fig"] = _guard(ctx, "local SGD", lambda: figures.comm_vs_k(t))
    d["loss_fig"] = _guard(ctx, "local SGD", lambda: loss_curves.training_loss(t))
    d["quality"] = _guard(ctx, "local SGD quality", lambda: localsgd_quality.gap_rows(t), [])
    d["quality_seeds"] = _guard(ctx, "local SGD quality", lambda: localsgd_quality.seed_rows(t), [])
    d["quality_note"] = localsgd_quality.INTERVAL_NOTE
    d["quality_figs"] = [f for f in (_guard(ctx, "local SGD quality", lambda: localsgd_quality.gap_vs_saved(
                                         d["quality"])),
                                     _guard(ctx, "local SGD quality", lambda: localsgd_quality.eval_curves(t)))
                         if f is not None]
    d["network"] = _guard(ctx, "network projection", lambda: network_section.projection(t))
    d["network_fig"] = _guard(ctx, "network projection", lambda: network_section.projection_figure(d["network"]))
    d["failures"] = tables.failure_rows(t)
    d["plan"] = _guard(ctx, "plan", lambda: plan_section.load_plan(run_dir))
    if d["plan"]:
        d["plan_fig"] = _guard(ctx, "plan", lambda: plan_section.plan_figure(d["plan"], loaded.records))
        d["plan_rows"] = _guard(ctx, "plan", lambda: plan_section.predicted_vs_measured(loaded.records, d["plan"]), [])
    if baseline_dir is not None:
        d["baseline_dir"] = baseline_dir
        d["baseline"] = _guard(ctx, "baseline", lambda: _baseline(ctx, t, baseline_dir))

    ctx.present = {
        "headline": True,
        "memory": bool(d["memory_figs"]),
        "pareto": bool(d["pareto_figs"]),
        "checks": bool(d["checks_total"]),
        "breakdown": d["breakdown_fig"] is not None,
        "timeline": bool(d["timeline_figs"] or d["timeline_note"]),  # a note: timelines there, none readable
        "localsgd": bool(d["localsgd"] or d["comm_fig"] or d["loss_fig"] or d["quality"] or d["network"]),
        "plan": bool(d.get("plan")),
        "failures": bool(d["failures"]),
        "baseline": baseline_dir is not None,
        "environment": True,
    }
    return ctx


def _baseline(ctx: Context, t, baseline_dir: str) -> dict:
    loaded, _, base = _load(baseline_dir)
    ctx.problems.extend(f"baseline: {p}" for p in loaded.problems)
    if base is None:
        return {"rows": [], "matched": 0, "only_current": len(t), "only_baseline": 0,
                "note": "the baseline has no readable records"}
    return tables.deltas(t, base)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["bytes"] = tables.fmt_bytes
    env.filters["num"] = tables.fmt_num
    env.filters["check_cells"] = check_format.cells
    return env


def render_html(ctx: Context) -> str:
    return environment().get_template("report.html").render(ctx=ctx, d=ctx.data, sections=SECTIONS)


def render_report(run_dir: str, out_path: str, baseline_dir: str | None = None, loaded=None) -> str:
    """Write the HTML report of `run_dir` to `out_path` (directories created) and return the path; every
    estimate check goes beside it as ``<report>.checks.csv`` (:func:`~.checks.csv_path`)."""
    ctx = build_context(run_dir, baseline_dir, loaded)
    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    path = checks.csv_path(out_path)
    if ctx.data.get("checks_total"):
        if _guard(ctx, "checks CSV", lambda: checks.write_checks_csv(ctx.tidy, path)) is not None:
            ctx.data["checks_csv"] = os.path.basename(path)
    else:
        remove_quietly(path)  # an earlier render's checks are not this run's
    answers = answers_table.csv_path(out_path)
    if ctx.groups:
        if _guard(ctx, "answers CSV", lambda: answers_table.write_answers_csv(ctx.groups, answers)) is not None:
            ctx.data["answers_csv"] = os.path.basename(answers)
    else:
        remove_quietly(answers)
    try:
        html = render_html(ctx)
    except Exception as exc:  # noqa: BLE001 - a template bug must still leave a readable file behind
        html = render_fallback(ctx, exc)
    write_text_atomic(out_path, html)
    return out_path


def render_fallback(ctx: Context, exc: Exception) -> str:
    """A bare page that still says what happened, when the full template could not be rendered."""
    from markupsafe import escape

    items = "".join(f"<li>{escape(p)}</li>" for p in ctx.problems)
    return (f"<!doctype html><html lang=\"en\"><meta charset=\"utf-8\"><title>{escape(ctx.title)}</title>"
            f"<h1>ckptbench report: {escape(ctx.title)}</h1><p>The report could not be rendered: "
            f"{escape(type(exc).__name__)}: {escape(str(exc))}</p><ul>{items}</ul></html>")
