"""The history as one self-contained HTML page: each series' flagged changes, then each point's peak bytes
and step time across the commits as a line (an SVG polyline; a flagged commit is a red mark).

Linear in commits × points and small: a line is one polyline of integer coordinates, so 1,000 commits × 50
points is two lines of about 8 KB per point (``scripts/history_scale.py`` measures it).  asv's own dashboard
(``asv publish``) draws asv's figures; this page draws ckptbench's judgement of them.
"""

from __future__ import annotations

import html
import time

from .series import CHARTED, History, Series

WIDTH, HEIGHT = 600, 60
NAMES = {"peak_bytes": "peak bytes", "step_time_median_s": "median step s"}


def _date(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ms / 1000)) if ms else ""


def _line(values: list, flagged: set[int]) -> str:
    known = [(i, v) for i, v in enumerate(values) if isinstance(v, (int, float))]
    if not known:
        return "<span class=none>not measured</span>"
    low, high = min(v for _, v in known), max(v for _, v in known)
    span, n = (high - low) or 1.0, max(len(values) - 1, 1)
    xy = [(round(i * WIDTH / n), round(HEIGHT - 4 - (v - low) * (HEIGHT - 8) / span)) for i, v in known]
    points = " ".join(f"{x},{y}" for x, y in xy)
    marks = "".join(f'<circle cx="{x}" cy="{y}" r="3"/>' for (i, _), (x, y) in zip(known, xy) if i in flagged)
    return (f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}"><polyline points="{points}"/>'
            f"{marks}</svg><span class=range>{low:.4g} – {high:.4g}</span>")


def _series(s: Series) -> str:
    esc = html.escape
    machine = ", ".join(f"{k} {v}" for k, v in s.parts.items()) or "machine file missing"
    out = [f"<h2>{esc(s.machine)} · {esc(s.env)}</h2><p>{esc(machine)}; {len(s.commits)} commits</p>"]
    rows = [f"<tr class={c.direction}><td>{esc(e.commit[:12])}</td><td>{_date(e.date_ms)}</td><td>{esc(c.label)}</td>"
            f"<td>{esc(c.quantity)}</td><td>{c.direction}</td><td>{esc(c.evidence)}</td></tr>"
            for e in s.commits for c in e.changes]
    notes = [f"<li>{esc(e.commit[:12])}: {esc(n)}</li>" for e in s.commits for n in e.notes]
    out.append("<table><tr><th>commit</th><th>date</th><th>point</th><th>quantity</th><th>change</th>"
               f"<th>evidence</th></tr>{''.join(rows)}</table>" if rows else "<p>No change flagged.</p>")
    if notes:
        out.append(f"<details><summary>{len(notes)} notes</summary><ul>{''.join(notes)}</ul></details>")
    flagged: dict[tuple[str, str], set[int]] = {}
    for i, e in enumerate(s.commits):
        for c in e.changes:  # a status change is marked on both lines
            for key in (CHARTED if c.quantity == "status" else (c.quantity,)):
                flagged.setdefault((c.case_id, key), set()).add(i)
    for cid, lines in s.values.items():
        charts = "".join(f"<div>{NAMES[key]} {_line(lines.get(key, []), flagged.get((cid, key), set()))}</div>"
                         for key in CHARTED)
        out.append(f"<h3>{esc(s.labels.get(cid, cid))} <small>{esc(cid)}</small></h3>{charts}")
    return "".join(out)


STYLE = ("body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:2px 8px;"
         "border-bottom:1px solid #ddd;text-align:left}tr.regression td{color:#b00}svg{vertical-align:middle;"
         "background:#fafafa}polyline{fill:none;stroke:#36c;stroke-width:1}circle{fill:#d00}.range,small{color:#777;"
         "margin-left:8px}")


def render(history: History, title: str = "Training history") -> str:
    esc = html.escape
    head = [f"<h1>{esc(title)}</h1>"]
    for line in history.failed + history.problems:
        head.append(f"<p class=problem>{esc(line)}</p>")
    body = "".join(_series(s) for s in history.series) or "<p>No ckptbench records.</p>"
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{esc(title)}</title><style>{STYLE}</style>"
            f"</head><body>{''.join(head)}{body}</body></html>")
