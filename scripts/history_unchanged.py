"""What the history says of unchanged code: the same training step measured again and again, each
measurement compared with the one before as ``ckptbench history`` compares two commits.

Two ways a commit's step is measured: in one process (``step_benchmark(repeats=1)``: asv's own) and in
three processes (the default).  Each measurement takes the calibration kernel's readings before and after,
as the benchmark does.  Writes every pair's step-time change, its p-value and verdict, and the memory
difference in bytes, to ``results/reference-history-unchanged/unchanged.json``.

    python scripts/history_unchanged.py [--pairs 6]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from historysteps.tiny import build  # noqa: E402

from ckptbench.base.env import cpu_model  # noqa: E402
from ckptbench.history.benchmark import kernel_readings  # noqa: E402
from ckptbench.history.step_repeat import measure_in_processes  # noqa: E402
from ckptbench.store.compare import compare_runs  # noqa: E402
from ckptbench.store.comparison import Thresholds  # noqa: E402
from ckptbench.store.machine_speed import load_readings  # noqa: E402
from ckptbench.store.records import RecordStore, load_records  # noqa: E402


def measured(work: str, processes: int) -> str:
    out = tempfile.mkdtemp(dir=work)
    kernel_readings(out, "start")
    records, problem = measure_in_processes("tiny", build, out, processes)
    if problem:
        raise SystemExit(problem)
    store = RecordStore(out)
    for r in records:
        store.append(r)
    kernel_readings(out, "end")
    return out


def pair(before: str, after: str) -> dict:
    comparison = compare_runs(load_records(before).records, load_records(after).records, Thresholds(memory=0.0),
                              load_readings(before), load_readings(after))
    (point,) = comparison.points
    time = next(d for d in point.deltas if d.quantity == "step_time_median_s")
    peak = next(d for d in point.deltas if d.quantity == "peak_bytes")
    return {"change": round(time.change, 4), "p_value": time.p_value, "verdict": time.verdict,
            "flagged": point.regressed or any(d.improved for d in point.deltas),
            "peak_bytes_difference": peak.new - peak.old, "machine_speed": comparison.machine_speed.state}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--out", default=os.path.join(ROOT, "results", "reference-history-unchanged"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="history-unchanged-")
    os.environ["OMP_NUM_THREADS"] = "1"
    found = {"machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count()}, "step": "scripts/historysteps/tiny.py",
             "threshold": "10 % and one-sided p < 0.05 (compare's defaults); memory: any byte"}
    try:
        for processes in (1, 3):
            runs = [measured(work, processes) for _ in range(args.pairs + 1)]
            pairs = [pair(a, b) for a, b in zip(runs, runs[1:])]
            found[f"{processes}_process"] = {"pairs": pairs, "flagged": sum(p["flagged"] for p in pairs)}
            print(processes, json.dumps(found[f"{processes}_process"]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "unchanged.json"), "w") as fh:
        json.dump(found, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
