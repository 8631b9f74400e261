"""The headline's table: each distinct answer once, with the questions (budgets) it answers.

Per (variant, sequence length) the headline asks the lowest peak and, per budget, the fastest setting that
fits (:func:`.headline.group_answers`).  Most budgets share an answer, so a row is one setting (or one
tie, or "nothing fits") and lists every question it answers.  A finely stepped sweep has thousands of
sequence lengths whose answers change at a few lengths only: consecutive lengths of one variant with the
same answers fold into one row over their range.  Past :data:`SHOWN` rows the page keeps the first ones
and says so; every group's every answer is in the CSV beside the report (:func:`write_answers_csv`).
"""

from __future__ import annotations

import csv
import io
import os

from ..base.finite import finite_number
from ..store.files import write_text_atomic
from .headline import Answer, GroupAnswers, against_none, describe
from .tables import fmt_bytes

SHOWN = 40  # rows on the page; the CSV has them all
CSV_SUFFIX = ".answers.csv"


def budget_name(label: str) -> str:
    """" within 8 GiB" -> "≤ 8 GiB"; "" (no budget) -> "fastest"."""
    return "fastest ≤ " + label.removeprefix(" within ") if label else "fastest"


def short_question(question: str) -> str:
    """"fastest ≤ 8 GiB" -> "≤ 8 GiB"; "fastest" -> "no budget"; "fastest (tied)" -> "no budget (tied)";
    any other question as it is."""
    if not question.startswith("fastest"):
        return question
    rest = question.removeprefix("fastest").strip()
    return rest if rest.startswith("≤") else ("no budget " + rest).strip()


def questions_text(questions: list[str]) -> str:
    """["lowest peak", "fastest", "fastest ≤ 8 GiB"] -> "lowest peak; fastest: no budget, ≤ 8 GiB"."""
    fast = [short_question(q) for q in questions if q.startswith("fastest")]
    return "; ".join([q for q in questions if not q.startswith("fastest")] + (["fastest: " + ", ".join(fast)]
                                                                              if fast else []))


def _key(answer: Answer) -> tuple:
    if answer.kind in ("winner", "only"):
        return ("setting", answer.best.name)
    if answer.kind == "tied":
        return ("tied", tuple(c.name for c in answer.tied))
    return ("none", bool(answer.excluded))


def _entries(g: GroupAnswers) -> list[dict]:
    """The group's distinct answers, in the order first asked, each with the questions it answers."""
    out: dict[tuple, dict] = {}
    if g.lowest is not None:
        name = g.name(g.lowest)
        out[("setting", name)] = {"questions": ["lowest peak"], "row": g.lowest, "answer": None}
    for label, _, answer in g.fastest:
        entry = out.setdefault(_key(answer), {"questions": [], "row": answer.best and answer.best.row,
                                              "answer": answer})
        entry["questions"].append(budget_name(label))
        if entry["answer"] is None:  # the lowest-peak point is also a budget's answer: say it as that
            entry["answer"] = answer
    return list(out.values())


def _signature(entries: list[dict]) -> tuple:
    return tuple((tuple(e["questions"]), _setting(e, None)[0]) for e in entries)


def _setting(entry: dict, group) -> tuple[str, str, str]:
    """(setting, tokens/s, against none) of an entry; `group` None: the setting's words only."""
    answer, row = entry["answer"], entry["row"]
    if answer is None:  # the lowest peak and no budget's answer: its name, no throughput question
        return entry.get("name") or "", _throughput(entry), "–" if group is None else against_none(row, group)
    if group is None:
        if answer.kind in ("winner", "only"):
            return answer.best.name, "", ""
        return ("tied within noise: " + ", ".join(c.name for c in answer.tied) if answer.kind == "tied"
                else f"no point fits{' (some left out)' if answer.excluded else ''}"), "", ""
    return describe(answer, group)


def distinct_rows(groups: list[GroupAnswers], shown: int = SHOWN) -> tuple[list[dict], int]:
    """The table's rows (at most `shown`) and how many rows there are in all.  Each row: where (one
    length, or a folded range), questions, setting, peak, tokens/s with its interval, against none."""
    runs: list[list[tuple[GroupAnswers, list[dict]]]] = []
    for g in groups:
        entries = _entries(g)
        for e in entries:
            if e["answer"] is None:
                e["name"] = g.name(e["row"])
        if runs and runs[-1][-1][0].variant == g.variant and \
                _signature(runs[-1][-1][1]) == _signature(entries):
            runs[-1].append((g, entries))
        else:
            runs.append([(g, entries)])
    total = sum(len(run[0][1]) for run in runs)
    rows: list[dict] = []
    for run in runs:
        if len(rows) >= shown:
            break
        first, last = run[0], run[-1]
        where = first[0].where if len(run) == 1 else (
            f"seq {first[0].seq:.0f}–{last[0].seq:.0f} ({len(run)} lengths)"
            + (first[0].where[first[0].where.find(" · "):] if " · " in first[0].where else ""))
        group = last[0].frame()  # a folded range is set against none at its longest sequence length
        for k, entry in enumerate(last[1]):
            if len(rows) >= shown:
                break
            setting, value, against = _setting(entry, group)
            peak = entry["row"].get("peak") if entry["row"] else None
            if len(run) > 1:
                firsts = [_throughput(e) for e in first[1]]
                value = f"{firsts[k]} … {_throughput(entry)} (first … last length)"
                against = f"at seq {last[0].seq:.0f}: {against}" if against not in ("–", "") else against
            rows.append({"where": where, "questions": questions_text(entry["questions"]), "setting": setting,
                         "peak": fmt_bytes(peak) if finite_number(peak) else "–", "value": value,
                         "against": against})
    return rows, total


def _throughput(entry: dict) -> str:
    row = entry["row"]
    tok = row.get("tok_s") if row else None
    return f"{tok:,.0f} tokens/s" if finite_number(tok) else "–"


def csv_path(report_path: str) -> str:
    return os.path.splitext(report_path)[0] + CSV_SUFFIX


CSV_COLUMNS = ("variant", "seq", "question", "kind", "setting", "strategy", "batch", "peak_bytes", "tok_s",
               "tok_s_low", "tok_s_high", "coverage")


def write_answers_csv(groups: list[GroupAnswers], path: str) -> str:
    """Every group's every question and its answer, one line each (the page shows at most SHOWN rows)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for g in groups:
        if g.lowest is not None:
            r = g.lowest
            w.writerow([g.variant, f"{g.seq:.0f}", "lowest peak", "only", g.name(r), r.get("strategy"),
                        f"{r['batch']:.0f}", _num(r.get("peak")), _num(r.get("tok_s")), "", "", ""])
        for label, _, answer in g.fastest:
            best = answer.best
            r = best.row if best else {}
            setting = _setting({"answer": answer, "row": r}, None)[0]
            w.writerow([g.variant, f"{g.seq:.0f}", budget_name(label), answer.kind, setting, r.get("strategy", ""),
                        f"{r['batch']:.0f}" if finite_number(r.get("batch")) else "", _num(r.get("peak")),
                        _num(best.tok_s if best else None), _num(best.low if best else None),
                        _num(best.high if best else None), _num(best.coverage if best else None)])
    write_text_atomic(path, buf.getvalue())
    return path


def _num(value) -> str:
    return repr(float(value)) if finite_number(value) else ""

