"""How far the step-time model's predictions are from the measured steps, on held-out points.

    python scripts/step_time_accuracy.py [--out DIR] [--models llama,qwen2,gpt2]     # run the CPU grid, then judge it
    python scripts/step_time_accuracy.py --from-run results/h200-.../run             # judge any run's records

Each point is predicted by :func:`ckptbench.theory.time.steptime.predict` from every *other* point of its run
(leave one out): its own measured step never enters its prediction, nor a twin's
(`theory/steptime.twins`).  A point with other strategies at the same batch and sequence is transformed
from them, as a sweep predicts its points.  A second table
predicts every point with its whole (batch, seq) left out, from the run's other shapes alone (the fit a
plan's other batches rely on).  Each table gives each point's prediction, its measured median step, the
error and the method; its summary how many are within ±10 % and ±25 %, and the mean |error|.

The CPU grid (run when no ``--from-run`` is given): three presets (llama-small at 2 layers, qwen2-tiny
at 3, gpt2-tiny at 4), each at one sequence length per batch (1, 4, 16) out of (128, 512, 2048), rotated
so that the models together meet every batch at every length, and at each of those four strategies
(none, every-2, full, full+offload): 36 points, one sweep per model through the product's own sweep
(fp32, sdpa, one thread).  A run's link for offload's copies is its ``calibration.json`` where it has one.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

MODELS = {"llama": ("llama-small", 2), "qwen2": ("qwen2-tiny", 3), "gpt2": ("gpt2-tiny", 4)}
STRATEGIES = ((0, False), (2, False), (1, False), (1, True))
BATCHES = (1, 4, 16)
SEQS = (128, 512, 2048)
TOLERANCES = (0.10, 0.25)


def points(model_index: int) -> list[tuple[int, bool, int, int]]:
    """(every_n_layers, offload, batch, seq): one length per batch, rotated by model; every strategy at each."""
    return [(n, off, b, SEQS[(j + model_index) % len(SEQS)])
            for j, b in enumerate(BATCHES) for n, off in STRATEGIES]


def suite_text(preset: str, layers: int, grid: list[tuple]) -> str:
    return (f'[suite]\nname = "step-time-{preset}"\ntimeout_s = 1800\n[model]\npreset = "{preset}"\nlayers = {layers}\n'
            f'max_positions = {max(SEQS)}\nattn = "sdpa"\n[train]\nwarmup_steps = 1\nmemory_steps = 1\nthreads = 1\n'
            f"[sweep]\nbatch_size = {sorted({p[2] for p in grid})}\nseq_len = {sorted({p[3] for p in grid})}\n"
            f"every_n_layers = {sorted({p[0] for p in grid})}\noffload = [false, true]\n")


def run_model(name: str, index: int, out: str) -> str:
    """One sweep of the model's grid points; returns its directory."""
    import dataclasses

    from ckptbench.run.sweep import SweepOptions, run_sweep
    from ckptbench.suite.parse import parse_suite
    from ckptbench.theory.verdicts.annotate import annotate_record

    preset, layers = MODELS[name]
    grid = points(index)
    suite = parse_suite(suite_text(preset, layers, grid), f"step-time accuracy {name}")
    cases = tuple(c for c in suite.cases if (c.every_n_layers, c.offload, c.batch_size, c.seq_len) in grid)
    run_dir = os.path.join(out, name)
    run_sweep(dataclasses.replace(suite, cases=cases), SweepOptions(out_dir=run_dir), annotate=annotate_record)
    return run_dir


def held_out(run_dir: str, other_shapes: bool = False) -> list[dict]:
    """Every ok point of the run, predicted from all the others (leave one out); with `other_shapes`, from
    the points at other (batch, seq) alone."""
    from ckptbench.point.case import Case
    from ckptbench.run.calibration import calibrated_link, read_calibration
    from ckptbench.store.records import load_records
    from ckptbench.theory.time.steptime import baselines, predict_from

    records = [r for r in load_records(run_dir).records if r.get("status") == "ok"]
    link = calibrated_link(read_calibration(os.path.join(run_dir, "calibration.json"), verify=True))
    bases = baselines(records)  # each record read once; predict_from leaves the target's own out
    rows = []
    for r in records:
        case = Case.from_dict(r["case"])
        others = [b for b in bases if not (other_shapes and b.shape == (case.batch_size, case.seq_len))]
        p = predict_from(case, others, link)
        measured = r["measurement"].get("step_time_median_s")
        row = {"model": case.model.label, "strategy": r["strategy"], "batch": case.batch_size, "seq": case.seq_len,
               "measured": measured, "load": (r.get("env") or {}).get("load_average", "")}
        if "predicted_s" in p and measured:
            row.update(predicted=p["predicted_s"], error=p["predicted_s"] / measured - 1, method=p["method"])
        else:
            row["why"] = p.get("error", "no measured step")
        rows.append(row)
    rows.sort(key=lambda x: (x["model"], x["strategy"], x["batch"], x["seq"]))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model | strategy | batch | seq | predicted s | measured s | error | method | load |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for x in rows:
        if "why" in x:
            lines.append(f"| {x['model']} | {x['strategy']} | {x['batch']} | {x['seq']} | – | – | – | {x['why']} | |")
            continue
        lines.append(f"| {x['model']} | {x['strategy']} | {x['batch']} | {x['seq']} | {x['predicted']:.4f} | "
                     f"{x['measured']:.4f} | {x['error']:+.1%} | {x['method']} | {x['load']} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    errors = [abs(x["error"]) for x in rows if "error" in x]
    if not errors:
        return "no point has both a prediction and a measurement"
    within = ", ".join(f"{sum(e <= t for e in errors)} of {len(errors)} within ±{t:.0%}" for t in TOLERANCES)
    by_method = {}
    for x in rows:
        if "error" in x:
            by_method.setdefault(x["method"], []).append(abs(x["error"]))
    methods = "; ".join(f"{m}: {sum(e <= TOLERANCES[0] for e in v)} of {len(v)} within ±{TOLERANCES[0]:.0%}"
                        for m, v in sorted(by_method.items()))
    return (f"{within}; mean |error| {statistics.mean(errors):.1%}, median {statistics.median(errors):.1%}, "
            f"largest {max(errors):.1%} ({methods}); {len(rows) - len(errors)} not predicted")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from-run", action="append", default=[], metavar="DIR",
                   help="judge this run's records (repeatable) instead of running the CPU grid")
    p.add_argument("--out", default=os.path.join("results", f"step-time-{time.strftime('%Y%m%d-%H%M%S')}"))
    p.add_argument("--models", default=",".join(MODELS))
    args = p.parse_args()
    runs = args.from_run
    if not runs:
        import torch

        from ckptbench.base.env import cpu_model

        before = os.getloadavg()
        for name in args.models.split(","):
            runs.append(run_model(name, list(MODELS).index(name), args.out))
            print(f"{name}: done", file=sys.stderr, flush=True)
        print(f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_model()} ({os.cpu_count()} cores, {platform.machine()}), "
              f"torch {torch.__version__}, 1 thread; load average before {before[0]:.2f}, after "
              f"{os.getloadavg()[0]:.2f}; records in {args.out}\n")
    for other_shapes, title in ((False, "leave one out"), (True, "every point from other (batch, seq) alone")):
        rows = [row for run in runs for row in held_out(run, other_shapes)]
        print(f"### {title}\n\n{table(rows)}\n\n{summary(rows)}\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
