"""Fit the achieved fractions of a CUDA run's card and write them where the plan reads them.

    python scripts/achieved_fit.py                                 # the committed H200 run
    python scripts/achieved_fit.py --from-run results/h100-.../run --name H100

Reads the run's ok single-rank CUDA records (their median step) and its calibration (the host link the
offload copies crossed), fits :func:`ckptbench.theory.time.achieved.fit` on every point (the figures a plan
uses: in-sample), predicts each (batch, sequence) shape from the fit on the run's other shapes (held out:
none of that shape's steps enter its prediction), and writes

- ``ckptbench/theory/time/achieved_fit.py``: the fitted figures and the held-out 5-95 % ratio interval, and
- a markdown table of every point (measured, in-sample, held-out) on stdout.

``tests/unit/test_achieved.py`` refits the committed run and requires the module to match.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_RUN = os.path.join("results", "h200-20261204-gpu-small", "run")


def run_fit(run: str):
    """`plan --from-run`'s own fit of a run (relative paths from the repository's root)."""
    from dataclasses import replace

    from ckptbench.cli.planspeed import run_fit as fit

    got = fit(os.path.join(ROOT, run))
    return None if got is None else (replace(got[0], source=run), got[1])  # named as given


def module_text(name: str, fitted) -> str:
    fields = ",\n    ".join(f"{k}={v!r}" for k, v in fitted.to_dict().items())
    return (f'"""The achieved fractions fitted on {fitted.source}\nby scripts/achieved_fit.py (do not edit: re-run it)."""\n\n'
            "from .achieved import Achieved\n\n"
            f"{name} = Achieved(\n    {fields},\n)\n")


def table(rows) -> str:
    out = ["| batch | seq | strategy | measured s | in-sample | held out | held-out error |",
           "| ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        c = r["case"]
        out.append(f"| {c.batch_size} | {c.seq_len} | {c.strategy} | {r['measured_s']:.4f} | "
                   f"{r['in_sample_s']:.4f} | {r['held_out_s']:.4f} | {r['held_out_s'] / r['measured_s'] - 1:+.1%} |")
    errors = [r["held_out_s"] / r["measured_s"] - 1 for r in rows]
    within = sum(abs(e) <= 0.15 for e in errors)
    out.append(f"\nheld out within ±15 %: {within} of {len(rows)}; mean |error| {sum(map(abs, errors)) / len(rows):.1%}, "
               f"largest {max(errors, key=abs):+.1%}")
    # each strategy's step over no checkpointing at the same shape: the ratio a choice between them rests on
    plain = {(r["case"].batch_size, r["case"].seq_len): r for r in rows if r["case"].strategy == "none"}
    ratios = [(r["held_out_s"] / p["held_out_s"]) / (r["measured_s"] / p["measured_s"]) - 1
              for r in rows if r["case"].strategy != "none"
              for p in [plain.get((r["case"].batch_size, r["case"].seq_len))] if p]
    if ratios:
        out.append(f"step over no checkpointing at the same shape, held out: within ±5 % at "
                   f"{sum(abs(e) <= 0.05 for e in ratios)} of {len(ratios)}, largest {max(ratios, key=abs):+.1%}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from-run", default=DEFAULT_RUN)
    p.add_argument("--name", default="H200")
    p.add_argument("--out", default=os.path.join(ROOT, "ckptbench", "theory", "time", "achieved_fit.py"))
    args = p.parse_args(argv)
    fitted = run_fit(args.from_run)
    if fitted is None:
        print(f"{args.from_run}: fewer than two shapes of ok single-rank CUDA steps: nothing fitted")
        return 0
    fitted, rows = fitted
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(module_text(args.name, fitted))
    print(table(rows))
    print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
