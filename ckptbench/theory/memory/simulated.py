"""Simulated predictions for every point of a suite, stored beside the real measurements.

``python -m ckptbench simulate-suite SUITE OUT`` runs the FakeTensor simulation (:mod:`.simulate`:
the real model's forward, backward and AdamW step on fake CPU tensors) for each Case and appends one line
per Case to ``OUT/simulated.jsonl``, keyed by ``case_id``.  Case ids hash every setting, so a file made on
a laptop from ``suites/gpu-small.toml`` matches the records a GPU run of the same suite writes, and the
report joins the two with :func:`load_simulated`.  Simulation needs no GPU: run it where device time is
not counted and carry the file.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable

from ...base.errors import UsageError
from ...base.regularfile import open_regular
from ...point.case import Case, Suite
from ...point.strategy import Recompute

SIMULATED = "simulated.jsonl"


def simulate_case(case: Case, simulate: Callable, padded: int | None = None) -> dict:
    """One line of simulated.jsonl: the prediction for `case`, or why there is none (`padded`: the batch's
    attention mask pads that many tokens, :meth:`~.loop_step.LoopStep.inputs`)."""
    line = {"case_id": case.id, "strategy": case.strategy, "batch_size": case.batch_size,
            "seq_len": case.seq_len, "status": "ok", "reason": "", "simulated": {}}
    if case.world_size > 1:
        line.update(status="unsupported", reason="multi-rank Cases are not simulated")
        return line
    t0 = time.perf_counter()
    # a layer set or SAC policy rides along only when there is one (a plain point's call is unchanged); a
    # SAC point's recomputation is counted too, the FLOPs its record is checked against
    extra = {"recompute": case.recompute} if case.recompute != Recompute() else {}
    if case.recompute.sac:
        extra["count_flops"] = True
    if case.grad_accum > 1:  # every micro-batch of the optimizer step
        extra["grad_accum"] = case.grad_accum
    if padded is not None:
        extra["padded"] = padded
    try:
        result = simulate(case.model, case.batch_size, case.seq_len, case.every_n_layers, case.offload,
                          lr=case.train.lr, device=case.device, setup=case.setup, **extra)
    except Exception as exc:  # one bad point must not lose the others' predictions
        line.update(status="error", reason=f"{type(exc).__name__}: {exc}"[:500])
        return line
    line["simulated"] = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    line["wall_s"] = time.perf_counter() - t0
    return line


def _append(path: str, line: dict) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def simulate_suite(suite: Suite, out_dir: str, simulate: Callable | None = None,
                   on_line: Callable[[dict, int, int], None] | None = None) -> str:
    """Append a prediction for each Case not yet in ``out_dir/simulated.jsonl``; returns the file's path.

    `simulate` defaults to :func:`.simulate.simulate` (imported here: it needs torch)."""
    if simulate is None:
        from .simulate import simulate
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, SIMULATED)
    done = {k for k, v in load_simulated(out_dir).items() if v.get("status") == "ok"}
    todo = [c for c in suite.cases if c.id not in done]
    for k, case in enumerate(todo):
        line = simulate_case(case, simulate)
        _append(path, line)
        if on_line is not None:
            on_line(line, k + 1, len(todo))
    return path


def load_simulated(run_dir: str) -> dict[str, dict]:
    """case_id → line of ``run_dir/simulated.jsonl`` (the last line of a Case wins; unreadable lines are
    skipped).  Empty when the file does not exist."""
    path = run_dir if run_dir.endswith(".jsonl") else os.path.join(run_dir, SIMULATED)
    out: dict[str, dict] = {}
    if not os.path.exists(path):
        return out
    try:
        fh = open_regular(path, "r", encoding="utf-8", errors="replace")
    except OSError as exc:  # a directory, a FIFO or a device in its place
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with fh:
        for raw in fh:
            try:
                line = json.loads(raw)
            except (json.JSONDecodeError, RecursionError):
                continue
            if _line_shape(line):
                out[line["case_id"]] = line
    return out


def _line_shape(line) -> bool:
    """Whether a parsed line is one :func:`simulate_case` writes: a case id, and its prediction a table whose
    peak is a positive number (a line of another shape is skipped, as an unreadable one is)."""
    if not isinstance(line, dict) or not isinstance(line.get("case_id"), str):
        return False
    sim = line.get("simulated") or {}
    if not isinstance(sim, dict):
        return False
    peak = sim.get("peak_bytes")
    return peak is None or (isinstance(peak, (int, float)) and not isinstance(peak, bool)
                            and math.isfinite(peak) and peak > 0)


def beside_measurements(records: list[dict], simulated: dict[str, dict]) -> list[dict]:
    """Each measured point beside its FakeTensor prediction (``simulated.jsonl``) and its estimate."""
    rows = []
    for r in records:
        sim = (simulated.get(r["case_id"]) or {}).get("simulated") or {}
        m, e = r.get("measurement") or {}, r.get("estimate") or {}
        if r.get("status") != "ok" or not sim.get("peak_bytes") or not m.get("peak_bytes"):
            continue
        c = r["case"]
        rows.append({"setting": f"{r.get('strategy')} b={c['batch_size']} s={c['seq_len']}",
                     "measured": m["peak_bytes"], "simulated": sim["peak_bytes"], "estimated": e.get("peak_bytes"),
                     "ratio": m["peak_bytes"] / sim["peak_bytes"], "measured_phase": m.get("peak_phase") or "–",
                     "simulated_phase": sim.get("peak_phase") or "–", "estimated_phase": e.get("peak_phase") or "–"})
    return rows
