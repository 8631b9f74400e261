"""Memory timelines beside the records: ``results/<run>/timelines.jsonl``, one line per timeline.

A record's timeline (``measurement.timeline``, :mod:`ckptbench.measure.timeline`: up to 2,000 samples and
1,000 marks) is four fifths of its line, and every reader of ``records.jsonl`` (report, compare, status,
``--resume``, ``plan --from-run``) would parse it for nothing: only the report's timeline section draws
a few of them.  So :func:`store_timeline`, called by :meth:`~.records.RecordStore.append` before the
record is written, moves it to a line of its own::

    {"attempt": 1, "case_id": "...", "repeat": 0, "schema": 1, "timeline": {...}}

appended with the records' guarantees (:func:`~.jsonl.append_line`), and leaves in the record
``measurement.timeline_stored = "timelines.jsonl"`` and ``measurement.timeline_samples``.  The timeline
is secondary: when its line cannot be written (a full disk) the record is still written, without it,
saying why in ``measurement.timeline_note``.  A record whose own append then fails leaves a timeline
line no record points to; readers ignore it, and the point run again appends a later line, which wins.

:class:`Timelines` reads the file as a hostile one: one pass over its bytes indexes each line by the
case id written in it, and a line is parsed only when a record asks for it, then checked in full
(:func:`timeline_problem`).  The last valid line of a (Case, repeat) wins.  Records written before the
side file carry their timeline inline, and are read from there.  Nothing in the record says where to
look: the side file is always ``timelines.jsonl`` beside the records.
"""

from __future__ import annotations

import json
import os

from ..base.errors import StorageError
from ..base.regularfile import open_regular
from .jsonl import append_line

TIMELINES = "timelines.jsonl"
TIMELINE_SCHEMA = 1
MAX_SAMPLES = 2000  # ckptbench.measure.timeline.MAX_SAMPLES: a longer list was not written by a sweep
MAX_MARKS = 1000
MAX_LABEL = 200
MAX_LINE = 1 << 20  # a timeline at its bounds is under 100 kB; a longer line is skipped unread
CHUNK = 1 << 22  # bytes read at a time when indexing the file
LISTED = 10  # problems listed one by one; the rest are counted
_CASE_KEY = b'"case_id": "'


def store_timeline(run_dir: str, record: dict) -> None:
    """Move `record`'s ``measurement.timeline`` to a line of ``timelines.jsonl`` (the record is changed in
    place: what the caller keeps is what ``records.jsonl`` will hold).  A timeline that cannot be written
    costs the timeline, never the record: the reason goes to ``measurement.timeline_note``."""
    m = record.get("measurement")
    if not isinstance(m, dict) or not isinstance(m.get("timeline"), dict):
        return
    timeline = m.pop("timeline")
    line = {"schema": TIMELINE_SCHEMA, "case_id": record.get("case_id"), "repeat": record.get("repeat", 0),
            "timeline": timeline}
    if "attempt" in record:
        line["attempt"] = record["attempt"]
    try:
        append_line(os.path.join(run_dir, TIMELINES), line)
    except StorageError as exc:
        m["timeline_note"] = f"timeline not stored: {exc}"
        return
    m["timeline_stored"] = TIMELINES
    samples = timeline.get("bytes")
    m["timeline_samples"] = len(samples) if isinstance(samples, list) else 0


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _increasing(values: list, strictly: bool) -> bool:
    pairs = zip(values, values[1:])
    return all(a < b for a, b in pairs) if strictly else all(a <= b for a, b in pairs)


def timeline_problem(tl) -> str | None:
    """What is wrong with a timeline read from a file, or None: the shape the report draws from, with its
    bounds (a sweep never writes more than :data:`MAX_SAMPLES` samples or :data:`MAX_MARKS` marks)."""
    if not isinstance(tl, dict):
        return f"a timeline is an object, not {type(tl).__name__}"
    events, values = tl.get("event"), tl.get("bytes")
    if not isinstance(events, list) or not isinstance(values, list):
        return "'event' and 'bytes' are not lists"
    if not values or len(events) != len(values):
        return f"'event' ({len(events)}) and 'bytes' ({len(values)}) are not the same non-zero length"
    if len(values) > MAX_SAMPLES:
        return f"{len(values)} samples, over the bound of {MAX_SAMPLES}"
    if not all(_int(v) and v >= 0 for v in events) or not all(_int(v) for v in values):
        return "'event' and 'bytes' hold something other than whole numbers"
    if not _increasing(events, strictly=True):
        return "'event' indices do not increase"
    marks = tl.get("marks", [])
    if not isinstance(marks, list) or len(marks) > MAX_MARKS:
        return f"'marks' is not a list of at most {MAX_MARKS}"
    if not all(isinstance(k, list) and len(k) == 2 and _int(k[0]) and isinstance(k[1], str)
               and len(k[1]) <= MAX_LABEL for k in marks):
        return "a mark is not [event, label]"
    if not _increasing([k[0] for k in marks], strictly=False):
        return "the marks' events do not increase"
    peak = tl.get("peak_event")
    if peak is not None and not (_int(peak) and events[0] <= peak <= events[-1]):
        return "'peak_event' is not an event of the timeline"
    for key in ("meter", "unit"):
        if not isinstance(tl.get(key, ""), str):
            return f"'{key}' is not text"
    for key in ("events", "marks_dropped", "max_samples"):
        if tl.get(key) is not None and not _int(tl.get(key)):
            return f"'{key}' is not a whole number"
    return None


def line_problem(line) -> str | None:
    """What is wrong with a parsed line of ``timelines.jsonl``, or None."""
    if not isinstance(line, dict):
        return f"a JSON {type(line).__name__}, not an object"
    if line.get("schema") != TIMELINE_SCHEMA:
        return f"schema {line.get('schema')!r} != {TIMELINE_SCHEMA}"
    if not isinstance(line.get("case_id"), str):
        return "no case id"
    if not (_int(line.get("repeat")) and line["repeat"] >= 0):
        return "'repeat' is not a whole number"
    if "attempt" in line and not _int(line["attempt"]):
        return "'attempt' is not a whole number"
    return timeline_problem(line.get("timeline"))


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number")


def _parse(data: bytes):
    """JSON, with NaN and Infinity refused (Python's reader takes them; a sweep never writes them)."""
    return json.loads(data, parse_constant=_no_constant)


def _scan(fh):
    """(line number, offset, length, what, case id) of each line of `fh`, read a chunk at a time (a
    run's timelines are hundreds of MB; no line is parsed or held on its own): `what` is ``line`` (ended by a newline),
    ``blank``, ``torn`` (the last line, without its newline) or ``long`` (over :data:`MAX_LINE`: passed
    over, never held whole); the case id is the text after the line's first ``"case_id": "``, or None."""
    buf, base, pos, number, eof = b"", 0, 0, 0, False
    while True:
        nl = buf.find(b"\n", pos)
        if nl < 0 and len(buf) - pos > MAX_LINE:  # too long: read on to its newline, keeping nothing
            number += 1
            start, length = base + pos, len(buf) - pos
            while (chunk := fh.read(CHUNK)) and (nl := chunk.find(b"\n")) < 0:
                length += len(chunk)
            if not chunk:
                yield number, start, length, "long", None
                return
            yield number, start, length + nl + 1, "long", None
            buf, base, pos = chunk, start + length, nl + 1
            continue
        if nl < 0:
            if eof:
                if pos < len(buf):
                    yield number + 1, base + pos, len(buf) - pos, "torn", None
                return
            chunk = fh.read(CHUNK)
            eof = not chunk
            buf, base, pos = buf[pos:] + chunk, base + pos, 0
            continue
        number += 1
        length = nl + 1 - pos
        if length > MAX_LINE:
            yield number, base + pos, length, "long", None
        else:
            at = buf.find(_CASE_KEY, pos, nl)
            end = buf.find(b'"', at + len(_CASE_KEY), nl) if at >= 0 else -1
            case_id = buf[at + len(_CASE_KEY):end].decode("utf-8", "replace") if end >= 0 else None
            yield number, base + pos, length, "line" if case_id or buf[pos:nl].strip() else "blank", case_id
        pos = nl + 1


def timelines_path(path: str) -> str:
    """The timelines file of a results directory, or of the directory holding a records file."""
    return os.path.join(path if os.path.isdir(path) else os.path.dirname(path) or ".", TIMELINES)


class Timelines:
    """The timelines of one run: :meth:`get` gives a record's, from the record itself (runs from before the
    side file) or from ``timelines.jsonl``, parsing only that Case's lines; :attr:`problems` says what
    could not be used, and why."""

    def __init__(self, path: str | None):
        self.path = timelines_path(path) if path else ""  # no path: inline timelines only
        self.problems: list[str] = []
        self._index: dict[str, list[tuple[int, int, int]]] | None = None  # case id -> (line, offset, length)
        self._lines: dict[str, dict[int, tuple[dict, object]]] = {}  # case id -> repeat -> (timeline, attempt)

    def _problem(self, text: str) -> None:
        self.problems.append(text)

    def index(self) -> dict[str, list[tuple[int, int, int]]]:
        """Case id -> where its lines are, from one pass over the file's bytes (nothing parsed)."""
        if self._index is not None:
            return self._index
        self._index = {}
        if not self.path:
            return self._index
        try:
            fh = open_regular(self.path)
        except FileNotFoundError:
            return self._index
        except OSError as exc:
            self._problem(f"{TIMELINES}: could not be read ({exc})")
            return self._index
        with fh:
            for number, start, length, what, case_id in _scan(fh):
                if what == "long":
                    self._problem(f"{TIMELINES}:{number}: longer than {MAX_LINE:,} bytes, skipped unread")
                elif what == "torn":
                    self._problem(f"{TIMELINES}:{number}: truncated last line ({length} bytes) ignored")
                elif case_id is not None:
                    self._index.setdefault(case_id, []).append((number, start, length))
                elif what != "blank":
                    self._problem(f"{TIMELINES}:{number}: no case id found in the line, skipped")
        return self._index

    def _read_case(self, case_id: str) -> dict[int, tuple[dict, object]]:
        """Repeat -> (timeline, attempt) of the last valid line of each repeat of `case_id`."""
        if case_id in self._lines:
            return self._lines[case_id]
        found: dict[int, tuple[dict, object]] = {}
        self._lines[case_id] = found
        where = self.index().get(case_id, [])
        if not where:
            return found
        try:
            with open(self.path, "rb") as fh:
                for number, offset, length in where:
                    fh.seek(offset)
                    self._take(found, case_id, number, fh.read(length))
        except OSError as exc:  # gone or unreadable since it was indexed
            self._problem(f"{TIMELINES}: could not be read ({exc})")
        return found

    def _take(self, found: dict, case_id: str, number: int, data: bytes) -> None:
        """Parse and check one line of `case_id`; a valid one replaces its repeat's earlier line in `found`."""
        try:
            line = _parse(data)
        except (ValueError, UnicodeDecodeError, RecursionError):  # JSONDecodeError is a ValueError; deep nesting
            self._problem(f"{TIMELINES}:{number}: unreadable line ({len(data)} bytes) ignored")
            return
        why = line_problem(line) or (None if line["case_id"] == case_id else "its case id is not where it was found")
        if why:
            self._problem(f"{TIMELINES}:{number}: not a timeline ({why}) ignored")
            return
        found[line["repeat"]] = (line["timeline"], line.get("attempt"))

    def get(self, record: dict) -> dict | None:
        """The timeline of `record`, or None (and, when it should have had one, a problem saying why)."""
        m = record.get("measurement") if isinstance(record, dict) else None
        if not isinstance(m, dict):
            return None
        point = f"point {record.get('case_id')!s:.12}"
        if "timeline" in m:  # written before timelines had a file of their own
            why = timeline_problem(m["timeline"])
            if why:
                self._problem(f"{point}: its record's timeline is not drawn ({why})")
                return None
            return m["timeline"]
        if not m.get("timeline_stored") or not isinstance(record.get("case_id"), str):
            return None
        if not os.path.exists(self.path):
            self._problem(f"{point}: its timeline is stored in {TIMELINES}, which is not beside the records")
            return None
        repeat = record.get("repeat", 0)
        if not _int(repeat):
            self._problem(f"{point}: its repeat is not a whole number")
            return None
        timeline, attempt = self._read_case(record["case_id"]).get(repeat, (None, None))
        if timeline is None:
            self._problem(f"{point}: no valid line for repeat {repeat} in {TIMELINES}")
            return None
        if record.get("attempt") is not None and attempt is not None and attempt != record["attempt"]:
            self._problem(f"{point}: {TIMELINES} holds attempt {attempt}'s timeline, not attempt "
                          f"{record['attempt']}'s, which is the record's")
            return None
        return timeline

    def unmatched(self, case_ids: set[str]) -> int:
        """How many lines of the file belong to none of `case_ids` (a point whose record was never written);
        0 when nothing asked for the file (it is not read for this)."""
        if self._index is None:
            return 0
        return sum(len(where) for case_id, where in self._index.items() if case_id not in case_ids)

    def note(self) -> str:
        """The problems in a sentence or two ("" when there were none)."""
        if not self.problems:
            return ""
        more = len(self.problems) - LISTED
        return (f"Timelines not used ({len(self.problems)}): " + "; ".join(self.problems[:LISTED])
                + (f"; and {more} more." if more > 0 else "."))


def has_stored_timeline(record: dict) -> bool:
    """Whether a record says it has a timeline (inline, or in the side file): a candidate for drawing."""
    m = record.get("measurement")
    return isinstance(m, dict) and (isinstance(m.get("timeline"), dict) or bool(m.get("timeline_stored")))
