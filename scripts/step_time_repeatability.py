"""How far the held-out grid's measured steps move between runs, and how much of the model's error is each point's own.

    python scripts/step_time_repeatability.py [--runs 20-32] [--errors 25-32] [DIR]

Reads the kept runs of the held-out grid under DIR (default ``results/reference-step-time-accuracy``), one
``run-N/<model>/<point>/records.jsonl`` per point (each point its own sweep, as the grid ran until the
trace-based step-time model; their predictions are the op-rate model's), and prints:

- **the measurement between runs**: each point's measured median step in every run of ``--runs`` against the
  median of those runs, how many of them land more than 10 % away, and how many of a run's 95 % intervals of
  the median (``step_time_ci95_s``, from that run's own steps) hold the next run's median;
- **the prediction's error, point by point**, over ``--errors``: its mean (what is systematic to the point)
  and its standard deviation from run to run, the runs' errors in order, and the number of the grid's points
  a run would have within ±10 % if each point's error were normal with that mean and deviation.

Every figure is read from a record; a record that cannot be read, or lacks a field, is named on stderr and
left out.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

TOLERANCE = 0.10


def span(text: str) -> list[int]:
    """Run numbers from "20-32" or "25-32,35,37" (ranges and single runs, comma-separated)."""
    runs = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        runs += range(int(first), int(last or first) + 1)
    return runs


def read_run(root: Path, run: int) -> dict[tuple[str, str], dict]:
    """(model, point) -> {measured, predicted, ci}; unreadable records are reported and skipped."""
    out = {}
    for path in sorted((root / f"run-{run}").glob("*/*/records.jsonl")):
        try:
            record = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
            m = record["measurement"]
            measured = float(m["step_time_median_s"])
            predicted = float(m["step_time_model"]["predicted_s"])
            ci = m.get("step_time_ci95_s")
            ci = (float(ci[0]), float(ci[1])) if isinstance(ci, list) and len(ci) == 2 else None
        except (OSError, IndexError, ValueError, KeyError, TypeError) as exc:
            print(f"{path}: left out ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        if not (measured > 0 and math.isfinite(predicted)):
            print(f"{path}: left out (measured {measured}, predicted {predicted})", file=sys.stderr)
            continue
        out[(path.parent.parent.name, path.parent.name.split("-", 1)[1])] = {
            "measured": measured, "predicted": predicted, "ci": ci}
    return out


def within_probability(mean: float, sd: float) -> float:
    """P(|error| <= tolerance) for a normal error, in percent units."""
    if sd <= 0:
        return float(abs(mean) <= 100 * TOLERANCE)
    cdf = lambda x: 0.5 * (1 + math.erf((x - mean) / (sd * math.sqrt(2))))  # noqa: E731
    return cdf(100 * TOLERANCE) - cdf(-100 * TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="results/reference-step-time-accuracy", type=Path)
    ap.add_argument("--runs", default="20-32", help="runs whose measurements are compared (default 20-32)")
    ap.add_argument("--errors", default="25-32", help="runs whose prediction errors are summed up (default 25-32)")
    args = ap.parse_args(argv)
    runs = {n: read_run(args.root, n) for n in span(args.runs)}
    points = sorted(set().union(*(r.keys() for r in runs.values())))

    print(f"## The measured step between runs {args.runs}\n")
    print("| model | point | runs | median s | lowest | highest | > 10 % off | next run's median in this run's interval |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    off_all = n_all = held_all = pairs_all = 0
    for key in points:
        seq = [(n, runs[n][key]) for n in sorted(runs) if key in runs[n]]
        values = [p["measured"] for _, p in seq]
        mid = statistics.median(values)
        off = sum(abs(v / mid - 1) > TOLERANCE for v in values)
        pairs = [(a, b) for (_, a), (_, b) in zip(seq, seq[1:]) if a["ci"]]
        held = sum(a["ci"][0] <= b["measured"] <= a["ci"][1] for a, b in pairs)
        off_all, n_all, held_all, pairs_all = off_all + off, n_all + len(values), held_all + held, pairs_all + len(pairs)
        print(f"| {key[0]} | {key[1]} | {len(values)} | {mid:.4f} | {100 * (min(values) / mid - 1):+.1f} % | "
              f"{100 * (max(values) / mid - 1):+.1f} % | {off} | {held} of {len(pairs)} |")
    print(f"\nIn all: {off_all} of {n_all} measurements more than 10 % from their point's median; "
          f"{held_all} of {pairs_all} next-run medians inside the run before's 95 % interval.\n")

    err_runs = {n: read_run(args.root, n) if n not in runs else runs[n] for n in span(args.errors)}
    print(f"## The prediction's error, point by point, runs {args.errors}\n")
    print("| model | point | mean | sd | runs' errors |")
    print("| --- | --- | ---: | ---: | --- |")
    rows, expected = [], 0.0
    for key in sorted(set().union(*(r.keys() for r in err_runs.values()))):
        errs = [100 * (r[key]["predicted"] / r[key]["measured"] - 1) for r in err_runs.values() if key in r]
        if len(errs) < 2:
            continue
        mean, sd = statistics.fmean(errs), statistics.stdev(errs)
        expected += within_probability(mean, sd)
        rows.append((mean, key, sd, errs))
    for mean, key, sd, errs in sorted(rows):
        print(f"| {key[0]} | {key[1]} | {mean:+.1f} % | {sd:.1f} | {' '.join(f'{e:+.0f}' for e in errs)} |")
    means = [r[0] for r in rows]
    sds = [r[2] for r in rows]
    counts = [sum(abs(100 * (r[k]["predicted"] / r[k]["measured"] - 1)) <= 100 * TOLERANCE for k in r)
              for r in err_runs.values()]
    print(f"\nPoints' mean errors {min(means):+.1f} to {max(means):+.1f} % (their mean {statistics.fmean(means):+.1f} %); "
          f"run-to-run sd {min(sds):.1f} to {max(sds):.1f} (median {statistics.median(sds):.1f}). "
          f"Within ±10 % per run: {', '.join(map(str, counts))} of {len(rows)}; "
          f"expected from the points' means and sds: {expected:.1f}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
