"""Print docs/step-time-model.md's accuracy table: the step-time model's prediction beside the measured step.

    python scripts/step_time_accuracy.py [--out DIR] [--models llama,qwen2,gpt2] [--steps N] [--passes N]
                                         [--only POINTS] [--max-steps N]

Every point runs through the product's own sweep, one sweep per point: a fresh worker builds the model,
runs its warm-up, memory and timed steps, then predicts its own step time
(:func:`ckptbench.run.steptime.predict`): the ops its memory step ran, each priced at its median over the
rounds of op timings made between the point's own timed steps (:mod:`ckptbench.run.raterounds`), in the
same process and the same conditions (each point's sweep has its own rate cache, so no point reuses a rate
timed beside another point's steps).  No training step is timed to calibrate anything: the rates are operator microbenchmarks and
the framework's time per op is probed on the architecture shrunk to no work (heads 4 wide, a 64-token
vocabulary, 16 tokens), whose widths, batch and sequence no point of the grid has, so every point is held
out.

The grid: three presets (llama-small at 2 layers, qwen2-tiny at 3, gpt2-tiny at 4), four strategies
(none, every-2, full, full+offload) and, for each (model, strategy), one sequence length per batch (1, 4,
16) out of (128, 512, 2048), rotated so each model meets every batch and length: 36 points.  The table
gives the wall-clock median of the timed steps (the record's step time) and the CPU time of the stepping
thread (its own cost, whatever else the machine runs), each against the prediction, with the load average
when the point ended.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time

MODELS = {"llama": ("llama-small", 2), "qwen2": ("qwen2-tiny", 3), "gpt2": ("gpt2-tiny", 4)}
STRATEGIES = ((0, False), (2, False), (1, False), (1, True))
BATCHES = (1, 4, 16)
SEQS = (128, 512, 2048)
TOLERANCE = 0.10


def points(model_index: int) -> list[tuple[int, bool, int, int]]:
    """(every_n_layers, offload, batch, seq): per strategy one length per batch, rotated by strategy and model."""
    return [(n, off, b, SEQS[(j + k + model_index) % len(SEQS)])
            for k, (n, off) in enumerate(STRATEGIES) for j, b in enumerate(BATCHES)]


def suite_text(preset: str, layers: int, grid: list[tuple], steps: int, max_steps: int | None = None) -> str:
    cap = f"max_steps = {max_steps}\n" if max_steps else ""
    return (f'[suite]\nname = "step-time-{preset}"\ntimeout_s = 1800\n[model]\npreset = "{preset}"\nlayers = {layers}\n'
            f'max_positions = {max(SEQS)}\nattn = "sdpa"\n[train]\nwarmup_steps = 1\nmemory_steps = 1\nsteps = {steps}\nthreads = 1\n{cap}'
            f"[sweep]\nbatch_size = {sorted({p[2] for p in grid})}\nseq_len = {sorted({p[3] for p in grid})}\n"
            f"every_n_layers = {sorted({p[0] for p in grid})}\noffload = [false, true]\n")


def run_model(name: str, index: int, out: str, steps: int, loads: dict, only: list[str] | None = None,
              max_steps: int | None = None) -> list[dict]:
    from ckptbench.run.sweep import SweepOptions, run_sweep
    from ckptbench.store.records import load_records
    from ckptbench.suite import parse_suite
    from ckptbench.theory.annotate import annotate_record

    preset, layers = MODELS[name]
    grid = points(index)
    suite = parse_suite(suite_text(preset, layers, grid, steps, max_steps), f"step-time accuracy {name}")
    cases = [c for c in suite.cases if (c.every_n_layers, c.offload, c.batch_size, c.seq_len) in grid]

    def annotate(case, record):
        annotate_record(case, record)
        loads[case.id] = os.getloadavg()[0]

    records = []
    for k, case in enumerate(cases):  # each point a sweep of its own: its rates timed after its own steps
        point = f"{case.strategy}-b{case.batch_size}-s{case.seq_len}"
        if only and point not in only:
            continue
        run_dir = os.path.join(out, name, f"{k:02d}-{point}")
        run_sweep(dataclasses.replace(suite, cases=(case,)), SweepOptions(out_dir=run_dir), annotate=annotate)
        records += load_records(run_dir).records
    return records


def row(name: str, r: dict, load: float | None) -> dict | None:
    c, m = r["case"], r.get("measurement") or {}
    model = m.get("step_time_model") or {}
    if r["status"] != "ok" or not model.get("predicted_s"):
        return {"model": name, "strategy": r["strategy"], "batch": c["batch_size"], "seq": c["seq_len"],
                "why": r.get("reason") or model.get("error") or r["status"]}
    predicted, wall = model["predicted_s"], m["step_time_median_s"]
    cpu = statistics.median(m["step_cpu_times_s"]) if m.get("step_cpu_times_s") else None
    return {"model": name, "strategy": r["strategy"], "batch": c["batch_size"], "seq": c["seq_len"],
            "predicted": predicted, "wall": wall, "cpu": cpu, "wall_error": predicted / wall - 1,
            "cpu_error": predicted / cpu - 1 if cpu else None, "load": load,
            "framework_us": model["framework_s_per_op"] * 1e6, "kernel_share": model["kernel_s"] / predicted}


def table(rows: list[dict]) -> str:
    lines = ["| model | strategy | batch | seq | predicted s | measured s (wall, median) | error | "
             "CPU time s (median) | error vs CPU time | load (1 min) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for x in rows:
        if "why" in x:
            lines.append(f"| {x['model']} | {x['strategy']} | {x['batch']} | {x['seq']} | – | – | {x['why']} | – | – | – |")
            continue
        cpu = f"{x['cpu']:.4f} | {x['cpu_error']:+.1%}" if x["cpu"] else "– | –"
        lines.append(f"| {x['model']} | {x['strategy']} | {x['batch']} | {x['seq']} | {x['predicted']:.4f} | "
                     f"{x['wall']:.4f} | {x['wall_error']:+.1%} | {cpu} | {x['load']:.2f} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    done = [x for x in rows if "why" not in x]
    if not done:
        return "no point has both a prediction and a measurement"
    out = []
    for key, what in (("wall_error", "the wall-clock median"), ("cpu_error", "the CPU time")):
        errors = [abs(x[key]) for x in done if x[key] is not None]
        if errors:
            within = sum(e <= TOLERANCE for e in errors)
            out.append(f"against {what}: {within} of {len(errors)} points within ±{TOLERANCE:.0%}, median |error| "
                       f"{statistics.median(errors):.1%}, largest {max(errors):.1%}")
    return "; ".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join("results", f"step-time-{time.strftime('%Y%m%d-%H%M%S')}"))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--steps", type=int, default=3, help="timed steps per point (the suites' default: 3)")
    p.add_argument("--passes", type=int, default=1, help="run the grid this many times, one table each")
    p.add_argument("--only", default="", help="these points only, e.g. every-2-b4-s128,full+offload-b1-s128")
    p.add_argument("--max-steps", type=int, default=None,
                   help="the timed steps' cap (train.max_steps; default the suites' 50): a short step reaches its "
                        "±2 %% target, or the cap, over a longer window")
    args = p.parse_args()
    import torch

    from ckptbench.env import cpu_model

    for k in range(args.passes):
        loads: dict[str, float] = {}
        started, load_before = time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()
        out = os.path.join(args.out, f"pass-{k + 1}") if args.passes > 1 else args.out
        rows = []
        for name in args.models.split(","):
            records = run_model(name, list(MODELS).index(name), out, args.steps, loads,
                                [x for x in args.only.split(",") if x], args.max_steps)
            rows += [row(name, r, loads.get(r["case_id"])) for r in records]
            print(f"{name}: {len(records)} points", file=sys.stderr, flush=True)
        rows.sort(key=lambda x: (list(MODELS).index(x["model"]), x["strategy"], x["batch"], x["seq"]))
        print(f"{'### pass ' + str(k + 1) + chr(10) + chr(10) if args.passes > 1 else ''}"
              f"{started}, {cpu_model()} ({os.cpu_count()} cores, {platform.machine()}), torch {torch.__version__}, "
              f"1 thread; load average before {load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f}, "
              f"after {' / '.join(f'{x:.2f}' for x in os.getloadavg())}; records in {out}\n")
        print(table(rows))
        print(f"\n{summary(rows)}\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
