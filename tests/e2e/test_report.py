"""The HTML report of a real tiny sweep: every section there, self-contained, failures shown, names escaped,
bad records files rendered as a message, and (when chromium is installed) a page that actually paints."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from ckptbench.report.browser import LAPTOP, browser, look, screenshot
from ckptbench.report.render import SECTIONS, render_report
from ckptbench.run.faults import Fault
from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.store.records import RECORDS, load_records
from ckptbench.store.timelines import TIMELINES, Timelines
from ckptbench.suite.parse import load_suite, parse_suite
from ckptbench.theory.verdicts.annotate import annotate_record
from tests.synthetic_run import write_run

from .report_html import Page, decoded_svgs, svg_resources

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
HEADINGS = dict(SECTIONS)
# Sections a single-process smoke run has data for (local SGD needs world_size > 1; baseline needs one).
SMOKE_SECTIONS = ("headline", "memory", "pareto", "checks", "breakdown", "timeline", "failures", "environment")
LABEL = "<script>alert(1)</script>"


def _render(run_dir: Path, name: str = "report.html", **kwargs) -> tuple[str, Page]:
    path = render_report(str(run_dir), str(run_dir / name), **kwargs)
    html = Path(path).read_text(encoding="utf-8")
    return html, Page(html)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The smoke suite swept once for the module, with one point forced to crash."""
    suite = load_suite(str(ROOT / "suites" / "smoke.toml"))
    out = tmp_path_factory.mktemp("smoke")
    victim = next(c for c in suite.cases if c.strategy == "every-2+offload")
    run_sweep(suite, SweepOptions(out_dir=str(out), faults={victim.id: Fault("raise")}), annotate=annotate_record)
    if not (out / "suite.toml").exists():  # until the sweep stores its suite file itself
        (out / "suite.toml").write_text(suite.text)
    html, page = _render(out)
    return SimpleNamespace(dir=out, html=html, page=page, victim=victim, suite=suite,
                           records=load_records(str(out)).records)


def test_all_sections_present(smoke):
    for key in SMOKE_SECTIONS:
        assert HEADINGS[key] in smoke.page.h2, key
    assert "could not be rendered" not in smoke.html


def test_timelines_are_kept_beside_the_records_and_drawn_from_there(smoke):
    ok = [r for r in smoke.records if r["status"] == "ok"]
    lines = (smoke.dir / TIMELINES).read_bytes().splitlines()
    assert len(ok) == 4 and len(lines) == len(ok)  # one line per ok point; the crashed point has none
    for line in (smoke.dir / RECORDS).read_bytes().splitlines():
        assert len(line) < 16 * 1024 and b'"timeline": {' not in line
    timelines = Timelines(str(smoke.dir))
    for r in ok:
        m = r["measurement"]
        tl = timelines.get(r)
        assert m["timeline_stored"] == TIMELINES and m["timeline_samples"] == len(tl["bytes"])
        assert max(tl["bytes"]) == m["peak_bytes"] and tl["bytes"][tl["event"].index(tl["peak_event"])] == m["peak_bytes"]
    assert timelines.problems == []
    section = smoke.html.split('<section id="timeline">', 1)[1].split("</section>", 1)[0]
    assert section.count("<img ") == 1 and 'class="absent"' not in section


def test_figures_are_embedded_and_nothing_is_fetched(smoke):
    page = smoke.page
    assert len(page.images) >= 4
    assert all(src.startswith("data:image/") for src in page.images)
    for tag, attr, value in page.refs:
        assert value.startswith(("data:", "#")), f"<{tag} {attr}={value[:60]!r}> references a resource"
    assert not page.tags & {"script", "link", "iframe", "object", "embed"}
    assert "@import" not in smoke.html and "url(http" not in smoke.html
    svgs = decoded_svgs(page)
    assert len(svgs) == len(page.images)
    for svg in svgs:
        assert svg_resources(svg) == []


def test_headline_answers_the_suite_budgets_each_once(smoke):
    rows = smoke.page.tables["headline"]
    (seq,) = {c.seq_len for c in smoke.suite.cases}  # one sequence length: one set of questions
    assert {row[0] for row in rows} == {f"seq {seq}"}
    asked = [q.strip() for row in rows for q in row[1].replace("fastest: ", "").replace(";", ",").split(",")]
    budgets = [f"≤ {b:g} GiB" for b in smoke.suite.budgets_gib]
    assert sorted(asked) == sorted(["lowest peak", "no budget", *budgets])  # each question in one row
    assert len({row[2] for row in rows}) == len(rows)  # and each row a distinct answer
    assert "Fastest setting per memory budget" in smoke.html  # the figure above the table


def test_estimate_checks_table(smoke):
    # the estimate's checks and the meters' ("meters.<quantity>"): every check a verdict counts
    checks = [c for r in smoke.records for c in r.get("checks") or []]
    checks += [{**c, "quantity": f"meters.{c['quantity']}"} for r in smoke.records
               for c in (r.get("meters") or {}).get("checks") or []]
    if not checks:
        assert HEADINGS["checks"] not in smoke.page.h2  # nothing to show: no section
        return
    quantities = {c["quantity"] for c in checks}
    assert len(smoke.page.tables["check-summary"]) == len(quantities)
    rows = smoke.page.tables["check-rows"]
    assert len(rows) == len(checks)
    verdicts = [row[0] for row in rows]
    # failures first, then predictions that are off, skips, predictions that agree, passes
    order = {"fail": 0, "off": 1, "skip": 2, "agrees": 3, "pass": 4}
    assert verdicts == sorted(verdicts, key=lambda v: order.get(v, 5))


def test_failures_table_lists_the_injected_crash(smoke):
    rows = smoke.page.tables["failures"]
    assert len(rows) == 1
    point, status, reason, tail = rows[0]
    assert smoke.victim.id in point and "every-2+offload" in point
    assert status == "crash"
    assert "injected fault" in reason + tail
    assert "<details><summary>show</summary><pre>" in smoke.html


def test_model_label_is_escaped(tmp_path):
    text = (ROOT / "suites" / "smoke.toml").read_text().replace('preset = "llama-tiny"',
                                                                 f'preset = "llama-tiny"\nlabel = "{LABEL}"')
    text = text.replace("every_n_layers = [0, 2, 1]", "every_n_layers = [0]").replace("offload = [false, true]", "")
    suite = parse_suite(text, "label.toml")
    assert suite.cases[0].model.label == LABEL
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path)))
    (tmp_path / "suite.toml").write_text(text)
    html, page = _render(tmp_path)
    assert "script" not in page.tags
    assert LABEL not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_empty_records_file_renders_a_message(tmp_path):
    (tmp_path / RECORDS).write_text("")
    html, page = _render(tmp_path)
    assert "no readable records" in html
    assert HEADINGS["environment"] in page.h2
    assert "suite file not stored" in html


def test_missing_records_file_renders_a_message(tmp_path):
    html, _ = _render(tmp_path)
    assert "no records file" in html and "no readable records" in html


def test_corrupt_records_file_keeps_what_is_readable(smoke, tmp_path):
    good = (smoke.dir / RECORDS).read_bytes()
    lines = good.splitlines(keepends=True)
    (tmp_path / RECORDS).write_bytes(lines[0] + b"{not json\n" + b"[1, 2]\n" + b"".join(lines[1:])
                                     + b'{"case_id": "torn", "sch')
    html, page = _render(tmp_path)
    assert "unreadable line" in html and "truncated last line" in html and "a JSON list, not an object" in html
    assert HEADINGS["headline"] in page.h2 and len(page.images) >= 4
    assert "could not be rendered" not in html


def test_baseline_deltas(smoke, tmp_path):
    html, page = _render(smoke.dir, "vs-self.html", baseline_dir=str(smoke.dir))
    assert HEADINGS["baseline"] in page.h2
    assert f"{len(smoke.records)} points matched by case id" in html
    assert all(row[-1] in ("+0.0 %", "–") for row in page.tables["deltas"])


@pytest.mark.skipif(browser() is None, reason="no chromium (apt-get install chromium) to render the page")
@pytest.mark.parametrize("which", ["smoke", "many lengths"])
def test_the_report_reads_in_a_browser_at_a_laptops_width(smoke, tmp_path, which):
    """Every figure decodes and has a text alternative, nothing scrolls sideways at 1366 px, no figure is
    shrunk below half its size, no script runs or fails; and the page paints (not blank, not one colour)."""
    from PIL import Image

    if which == "smoke":
        page = smoke.dir / "report.html"
    else:  # 600 points at 300 sequence lengths: panels chosen, rows folded and cut, the CSV beside
        run = write_run(str(tmp_path / "run"), 600, vary="seq")
        page = Path(render_report(run, str(tmp_path / "many.html")))
        assert (tmp_path / "many.answers.csv").exists()
    seen = look(str(page))
    assert seen.images >= 4 and seen.broken == [] and seen.without_alt == []
    assert not seen.scrolls_sideways, f"{seen.page_width} px wide at {seen.viewport}"
    assert seen.smallest_scale >= 0.5 and seen.font_px >= 14
    assert seen.scripts == 0 and seen.errors == []
    png = screenshot(str(page), str(tmp_path / "report.png"), *LAPTOP)
    image = Image.open(png).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50, "screenshot is (nearly) blank"
    assert max(n for n, _ in colours) < 0.97 * image.size[0] * image.size[1], "screenshot is one colour"


@pytest.mark.parametrize("setup,why", [
    (lambda d: d.mkdir(), "no records file"),
    (lambda d: (d.mkdir(), (d / RECORDS).write_text("")), "the records file is empty"),
    (lambda d: (d.mkdir(), (d / RECORDS).write_bytes(b"garbage\n\x00\x01")), "unreadable line"),
    (lambda d: d.write_text((ROOT / "suites" / "smoke.toml").read_text()), "unreadable line"),  # a suite file
])
@pytest.mark.parametrize("command", ["report", "gpu-summary"])
def test_commands_on_a_run_with_nothing_to_say_fail_in_one_line(tmp_path, capsys, setup, why, command):
    from ckptbench.cli import main

    run = tmp_path / "run"
    setup(run)
    code = main([command, str(run)] + (["-o", str(tmp_path / "r.html")] if command == "report" else []))
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {run}: no readable records") and why in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "r.html").exists()
