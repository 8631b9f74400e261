"""The results store: ``results/<run>/records.jsonl``, one schema-versioned JSON object per Case.

Appends are atomic in the sense that matters (:mod:`.jsonl`): each record is one ``write`` of a whole
line to a file opened with ``O_APPEND``, under an exclusive ``flock`` (so sweeps sharded over one output
never interleave), followed by ``fsync``.  A sweep killed at any moment loses at most the point in
flight; a torn last line (a crash mid-write on a filesystem that allows it) is detected on load,
reported, and never parsed as data.  A record's memory timeline is kept beside it, in
``timelines.jsonl`` (:mod:`.timelines`), so that reading the records never parses it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from dataclasses import dataclass, field

try:
    import orjson
except ImportError:  # a machine's own python without it (a GPU image): the json module reads every line
    orjson = None

from ..base.errors import StorageError, UsageError
from ..base.regularfile import open_regular
from .jsonl import append_line
from .repeats import merge_repeats, single_records
from .timelines import store_timeline
from .validate import record_problem

SCHEMA_VERSION = 1
RECORDS = "records.jsonl"
LISTED = 10  # skipped lines listed one by one; the rest are counted


@dataclass
class LoadedRecords:
    """Records read back, plus what could not be read (with line numbers), so nothing fails silently."""

    records: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one per line skipped (or a missing file)
    path: str = ""
    skipped: int = 0  # lines read and not used: unreadable, torn, or not of a record's shape

    def ids(self) -> set[str]:
        return {r["case_id"] for r in self.records if "case_id" in r}

    def notes(self) -> list[str]:
        """What a command prints about the lines it skipped: how many, then the first few of them."""
        if not self.skipped:
            return list(self.problems)
        more = len(self.problems) - LISTED
        return ([f"{self.path}: {self.skipped} line{'s' if self.skipped != 1 else ''} skipped (not valid records)"]
                + self.problems[:LISTED] + ([f"... and {more} more"] if more > 0 else []))


class RecordStore:
    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, RECORDS)

    def ensure(self) -> None:
        try:
            os.makedirs(self.run_dir, exist_ok=True)
        except OSError as exc:
            raise StorageError(self.run_dir, exc, "creating") from exc

    def append(self, record: dict) -> None:
        """Append one line (:func:`~.jsonl.append_line`); on any failure (a full disk) the file is cut back
        to the records before it.  A timeline in the record's measurement goes first to a line of its own
        in ``timelines.jsonl`` (:func:`~.timelines.store_timeline`; `record` is changed to what is written).

        Raises :class:`~ckptbench.base.errors.StorageError` naming the file and the reason.
        """
        store_timeline(self.run_dir, record)
        append_line(self.path, {"schema": SCHEMA_VERSION, **record})

    def load(self) -> LoadedRecords:
        """The last line of each (Case, repeat), repeats not merged: what a sweep resumes from."""
        return load_records(self.path, merged=False)


def load_records(path: str, merged: bool = True) -> LoadedRecords:
    """Every readable record of a run, one per Case (`merged`) or one per (Case, repeat)."""
    ranks: list[str] = []
    if os.path.isdir(path):
        ranks = rank_files(path)
        path = os.path.join(path, RECORDS)
    out = LoadedRecords(path=path)
    if not os.path.exists(path):
        out.problems.append(f"{path}: no records file")
        return out
    try:
        fh = open_regular(path)
    except OSError as exc:  # a directory, a FIFO or a device where the records should be: one line, exit 2
        raise UsageError(f"{path}: cannot read the records: {exc.strerror or exc}") from None
    with fh, no_cycle_collection():  # line by line: never the whole file at once
        for number, line in enumerate(fh, start=1):
            _read_line(out, path, number, line)
        for extra in ranks:  # a tracked torchrun's other ranks, each its own record
            try:
                rank_fh = open_regular(extra)
            except OSError as exc:
                out.problems.append(f"{extra}: cannot read the records: {exc.strerror or exc}")
                continue
            with rank_fh:
                for number, line in enumerate(rank_fh, start=1):
                    _read_line(out, extra, number, line)
        out.records = latest_per_case(out.records) if merged else list(_latest_lines(out.records).values())
    return out


def rank_files(directory: str) -> list[str]:
    """The records of a tracked run's other ranks, ``rank-<r>/records.jsonl`` under its directory, by rank."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        suffix = name.removeprefix("rank-")
        if suffix != name and suffix.isdigit() and os.path.isfile(os.path.join(directory, name, RECORDS)):
            found.append((int(suffix), os.path.join(directory, name, RECORDS)))
    return [p for _, p in sorted(found)]


def record_key(record: dict) -> tuple:
    """What makes a record one of its own: its Case and repeat, and of a tracked run the rank (ranks beyond 0)
    and the step a later measurement began at (steps beyond 0)."""
    track = record.get("track")
    key = (record["case_id"], record.get("repeat", 0))
    if not isinstance(track, dict):
        return key
    tracked_rank, from_step = track.get("rank"), track.get("from_step")
    if isinstance(tracked_rank, int) and tracked_rank > 0:
        key += (tracked_rank,)
    return key + (("from", from_step),) if isinstance(from_step, int) and from_step > 0 else key


@contextlib.contextmanager
def no_cycle_collection():
    """Parsed JSON holds no reference cycles, but the millions of dicts and lists of a large run make the
    cyclic collector walk everything read so far, again and again (about a third of the reading time,
    four fifths of turning 20,000 records into compare's points): it is paused while reading, and while
    what was read is turned into something else, and resumed after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def parse_line(line: bytes):
    """One JSON line: orjson (a third of the json module's time on a large run), and where orjson refuses
    what the json module reads (NaN, Infinity, nesting past 1,024) the json module, so such a line reads as
    before.  An integer past 64 bits reads as the float nearest it (no count a sweep writes comes near).
    Without orjson installed, the json module reads every line."""
    if orjson is None:
        return json.loads(line)
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def _read_line(out: LoadedRecords, path: str, number: int, line: bytes) -> None:
    """Parse and check one line (with its newline, if it has one); a record is appended to `out.records`,
    anything else is counted and listed in `out.problems`."""
    if not line.strip():
        return
    torn = not line.endswith(b"\n")  # only the last line of a file can lack its newline
    line = line.rstrip(b"\n")
    try:
        record = parse_line(line)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        out.problems.append(f"{path}:{number}: {'truncated last line' if torn else 'unreadable line'} "
                            f"({len(line)} bytes) ignored")
        out.skipped += 1
        return
    if isinstance(record, dict) and "case_id" in record and record.get("schema") != SCHEMA_VERSION:
        why = f"schema {record.get('schema')!r} != {SCHEMA_VERSION}"
    else:
        why = record_problem(record)
    if why:
        out.problems.append(f"{path}:{number}: not a record ({why}) ignored")
        out.skipped += 1
        return
    out.records.append(record)


def latest_per_case(records: list[dict]) -> list[dict]:
    """One record per Case.  The last line of each (Case, repeat) wins: a point recorded as ``skipped``
    (deadline) and run later by ``--resume`` has two lines, and the later one is the result.  A Case run
    several times is merged into one record (:func:`~.repeats.merge_repeats`).  Order of first appearance."""
    return merged_cases(_latest_lines(records))


def merged_cases(latest: dict[tuple, dict]) -> list[dict]:
    """:func:`latest_per_case` of lines already reduced to the last of each :func:`record_key`."""
    groups: dict[tuple, list[dict]] = {}
    for (case_id, _, *rank), record in latest.items():
        groups.setdefault((case_id, *rank), []).append(record)
    singles = single_records([g[0] for g in groups.values() if len(g) == 1])[::-1]
    return [singles.pop() if len(group) == 1 else merge_repeats(group) for group in groups.values()]


def latest_lines(records: list[dict]) -> dict[tuple, dict]:
    """The last line of each (Case, repeat), in order of first appearance."""
    return _latest_lines(records)


def _latest_lines(records: list[dict]) -> dict[tuple, dict]:
    latest: dict[tuple, dict] = {}
    for record in records:
        latest[record_key(record)] = record  # a later line replaces an earlier one
    return latest


def distinct_runs(records: list[dict]) -> int:
    """How many (Case, repeat) pairs the lines hold: more lines than that are reruns of the same pair."""
    return len({record_key(r) for r in records})


def to_frame(records: list[dict]):
    """A flat pandas DataFrame: nested fields become dotted columns (``case.batch_size``, ...)."""
    import pandas as pd

    if not records:
        return pd.DataFrame()
    return pd.json_normalize(records, sep=".")


def export_csv(run_dir: str, out_path: str | None = None) -> str:
    loaded = load_records(run_dir)
    frame = to_frame(loaded.records)
    out_path = out_path or os.path.join(run_dir, "records.csv")
    frame.to_csv(out_path, index=False)
    return out_path
