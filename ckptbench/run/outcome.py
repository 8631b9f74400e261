"""What became of a job, in a small JSON file the job writes itself as it ends.

submitit ends a job by pickling its return value or its traceback into ``<job>_0_result.pkl``.
Unpickling runs whatever the file says, and a results directory may be shared or copied from anywhere,
so nothing that only reads one (``ckptbench status``) opens a pickle: each job writes
``<job>_outcome.json`` beside submitit's files, and status reads that.  A job that ended without one
(killed, or failed before its sweep started) is known by its result file's presence and the last line
of its log, both read as plain bytes.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

from ..base.regularfile import open_regular
from ..store.files import tail, write_json_atomic

REASON_CHARS = 200  # of a failure's last line, as status prints it
JOB_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")  # Slurm's 4242_0, a local pid: never a path


def outcome_path(folder: str, job_id: str) -> str:
    return os.path.join(folder, f"{job_id}_outcome.json")


def write_outcome(folder: str, job_id: str, error: BaseException | None) -> None:
    """Note the job's end: ``finished``, or ``failed`` with the exception's last line.  A note that
    cannot be written is said on stderr and changes nothing else: the job's result stands."""
    note = {"job": job_id, "state": "finished", "ended_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if error is not None:
        note.update(state="failed", reason=_last_line(f"{type(error).__name__}: {error}"))
    try:
        write_json_atomic(outcome_path(folder, job_id), note)
    except OSError as exc:
        print(f"ckptbench: could not write {outcome_path(folder, job_id)}: {exc}", file=sys.stderr, flush=True)


def job_outcome(folder: str, job_id: str) -> str:
    """``finished``, ``failed: why``, or what the files that are there say, without unpickling any."""
    if not JOB_ID.fullmatch(job_id):
        return f"unknown: job id {job_id!r} is no file name"
    try:
        with open_regular(outcome_path(folder, job_id), "r", encoding="utf-8") as fh:
            note = json.load(fh)
    except FileNotFoundError:
        note = None
    except (OSError, ValueError) as exc:
        return f"outcome file unreadable ({type(exc).__name__})"
    if note is not None:
        state = note.get("state") if isinstance(note, dict) else None
        if state == "finished":
            return "finished"
        if state == "failed":
            return f"failed: {_last_line(str(note.get('reason', '')))}"
        return "outcome file unreadable (no state)"
    if not os.path.exists(os.path.join(folder, f"{job_id}_0_result.pkl")):
        return "no result yet (queued, or ended without one)"
    log = f"{job_id}_0_log.err"
    text = tail(os.path.join(folder, log), 4096)
    if not text.strip():
        return f"ended without an outcome file (see {log})"
    return f"ended without an outcome file; {log} ends: {_last_line(text)}"


def _last_line(text: str) -> str:
    """The last non-blank line, printable characters only, cut to :data:`REASON_CHARS`."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    line = lines[-1].strip() if lines else "?"
    return "".join(ch if ch.isprintable() else "?" for ch in line)[:REASON_CHARS]
