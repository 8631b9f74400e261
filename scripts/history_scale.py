"""How ``ckptbench history`` scales: 1,000 commits × 50 points, read, judged and drawn.

Builds a results directory as the history benchmarks leave it (``ckptbench/<machine>/<env>/<commit>/``
plus asv's results files for the dates), each commit's records made from the first 50 points of the
committed ``results/reference-strategies-cpu`` run (kept to the keys the history reads: case, status, env,
the memory figures and the step times), each record's step times scaled by a factor of 5 % spread, a peak 1 KiB larger from every 100th
commit on (the memory commits flagged must be exactly those 9).  Then times ``build_history`` (reading and judging) and ``render`` (the page) with the
script's own clock, and writes the figures to ``results/reference-history-scale/scale.json``.

    python scripts/history_scale.py [--commits 1000] [--points 50] [--out results/reference-history-scale]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ckptbench.base.env import cpu_model  # noqa: E402
from ckptbench.history.page import render  # noqa: E402
from ckptbench.history.series import build_history  # noqa: E402

SOURCE = os.path.join(ROOT, "results", "reference-strategies-cpu", "records.jsonl")
KEPT = ("peak_bytes", "mem_after_forward_bytes", "saved_bytes", "step_times_s", "step_time_median_s",
        "step_time_mean_s", "step_time_p90_s", "step_time_cv", "tokens_per_s")


def points(n: int) -> list[dict]:
    out, seen = [], set()
    with open(SOURCE, encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            if r["status"] != "ok" or r["case_id"] in seen:
                continue
            seen.add(r["case_id"])
            m = r["measurement"]
            out.append({"schema": r["schema"], "case": r["case"], "case_id": r["case_id"], "status": "ok", "strategy": r["strategy"],
                        "suite": r.get("suite", ""), "env": {"cpu": r["env"]["cpu"], "cpu_count": r["env"]["cpu_count"]},
                        "measurement": {k: m[k] for k in KEPT if k in m}})
            if len(out) == n:
                return out
    raise SystemExit(f"{SOURCE} has {len(out)} ok points, not {n}")


def build(results: str, commits: int, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    base = points(n)
    folder = os.path.join(results, "ckptbench", "m0", "env")
    os.makedirs(folder)
    with open(os.path.join(results, "ckptbench", "m0", "machine.json"), "w") as fh:
        json.dump({"cpu": base[0]["env"]["cpu"], "cpu_count": base[0]["env"]["cpu_count"], "accelerator": "none"}, fh)
    os.makedirs(os.path.join(results, "box"))
    for c in range(commits):
        commit = hashlib.sha1(str(c).encode()).hexdigest()
        os.makedirs(os.path.join(folder, commit))
        grow = 1024 * (c // 100)  # a memory change at every 100th commit
        with open(os.path.join(folder, commit, "records.jsonl"), "w") as fh:
            for r in base:
                m = dict(r["measurement"])
                factor = rng.lognormvariate(0, 0.05)
                m["step_times_s"] = [t * factor * rng.lognormvariate(0, 0.02) for t in m["step_times_s"]]
                m["step_time_median_s"] = sorted(m["step_times_s"])[len(m["step_times_s"]) // 2]
                m["tokens_per_s"] = r["measurement"]["tokens_per_s"] / factor
                m["peak_bytes"] += grow
                fh.write(json.dumps({**r, "measurement": m}) + "\n")
        with open(os.path.join(results, "box", f"{commit[:8]}-env.json"), "w") as fh:
            json.dump({"commit_hash": commit, "env_name": "env", "date": 1_700_000_000_000 + c * 60_000,
                       "results": {}, "version": 2}, fh)


def page_of(commits: int, n: int) -> tuple[str, object]:
    """The page and the history of a built directory of `commits` × `n` points (what the test checks)."""
    work = tempfile.mkdtemp(prefix="history-scale-")
    try:
        build(os.path.join(work, "results"), commits, n)
        history = build_history(os.path.join(work, "results"))
        return render(history), history
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--points", type=int, default=50)
    parser.add_argument("--out", default=os.path.join(ROOT, "results", "reference-history-scale"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="history-scale-")
    try:
        results = os.path.join(work, "results")
        build(results, args.commits, args.points)
        t0 = time.perf_counter()
        history = build_history(results)
        t1 = time.perf_counter()
        page = render(history)
        t2 = time.perf_counter()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (series,) = history.series
    flagged = [c for c in series.commits if c.changes]
    figures = {"commits": args.commits, "points": args.points, "read_and_judge_s": round(t1 - t0, 2),
               "render_s": round(t2 - t1, 2), "total_s": round(t2 - t0, 2), "page_bytes": len(page.encode()),
               "memory_commits_flagged": sum(any(ch.quantity == "peak_bytes" for ch in c.changes) for c in flagged),
               "machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count()}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "scale.json"), "w") as fh:
        json.dump(figures, fh, indent=1)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
