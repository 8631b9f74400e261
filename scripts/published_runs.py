"""Hold ``ckptbench plan`` against published multi-GPU training runs: plan's tokens/s per GPU beside theirs.

    python scripts/published_runs.py [--runs docs/published-runs.toml]

Each ``[[run]]`` of the file is one published setup, transcribed from its source::

    [[run]]
    source = "project docs or paper, the table or figure"
    device = "h100"             # a plan --device name
    world = 64                  # GPUs
    ranks_per_host = 8
    network = "400G IB"         # plan --network (between hosts when world > ranks_per_host)
    intra_host = "NVLink"
    model = "llama-8b"          # a preset or a config.json
    seq = 8192
    batch = 1                   # local batch per GPU
    precision = "bf16-mixed"
    sharding = "fsdp"
    checkpointing = "every-2"   # a plan strategy name: none, full, every-N
    tokens_per_s_per_gpu = 0.0  # as published
    mfu = 0.0                   # optional, as published
    memory_gib = 0.0            # optional, with memory_kind = "reserved" | "allocated"
    fitted = false              # true when a plan input was fitted on this run (its row is in-sample)
    differences = "their model code is not transformers'; ..."

For each run the script plans the setup at its local batch (``plan --batch``, ``--json``), takes the
published checkpointing's row, and prints a markdown table: published and predicted tokens/s per GPU,
their ratio, and whether the row is held out.  The summary judges accuracy on held-out rows only, and,
where one source publishes several checkpointing settings of one setup, the regret of plan's pick
among them (the published tokens/s of the best over that of the one plan ranks first).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "docs", "published-runs.toml")
SETUP = ("device", "world", "ranks_per_host", "network", "intra_host", "model", "seq", "batch", "precision",
         "sharding")


def plan_json(run: dict) -> dict:
    args = [sys.executable, "-m", "ckptbench", "plan", "--model", str(run["model"]), "--device", run["device"],
            "--seq", str(run["seq"]), "--batch", str(run["batch"]), "--precision", run["precision"],
            "--attn", run.get("attn", "sdpa"), "--world", str(run["world"]), "--sharding", run["sharding"],
            "--network", run["network"], "--ranks-per-host", str(run.get("ranks_per_host", 8)),
            "--intra-host", run.get("intra_host", "NVLink"), "--json"]
    if run.get("memory"):
        args += ["--memory", run["memory"]]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{run['source']}: plan failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def row_of(plan: dict, strategy: str) -> dict | None:
    return next((o for o in plan["options"] if o["strategy"] == strategy), None)


def judge(runs: list[dict]) -> tuple[list[str], list[str]]:
    """(table lines, summary lines) for the runs."""
    lines = ["| source | cards | model | seq | batch | checkpointing | published tok/s/GPU | predicted | "
             "interval | ratio | held out |", "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | --- | ---: | --- |"]
    held, groups = [], {}
    for run in runs:
        plan = plan_json(run)
        o = row_of(plan, run["checkpointing"])
        if o is None or not o["tokens_per_s"]:
            lines.append(f"| {run['source']} | {run['world']}x {run['device']} | {run['model']} | {run['seq']} | "
                         f"{run['batch']} | {run['checkpointing']} | {run['tokens_per_s_per_gpu']:,.0f} | "
                         "does not fit | - | - | - |")
            continue
        predicted = o["tokens_per_s"] / run["world"]
        low = o["tokens_per_s"] * o["step_s"] / o["step_high_s"] / run["world"] if o.get("step_high_s") else None
        high = o["tokens_per_s"] * o["step_s"] / o["step_low_s"] / run["world"] if o.get("step_low_s") else None
        ratio = run["tokens_per_s_per_gpu"] / predicted
        if not run.get("fitted"):
            held.append(ratio)
        interval = f"{low:,.0f}-{high:,.0f}" if low else "-"
        lines.append(f"| {run['source']} | {run['world']}x {run['device']} | {run['model']} | {run['seq']} | "
                     f"{run['batch']} | {run['checkpointing']} | {run['tokens_per_s_per_gpu']:,.0f} | "
                     f"{predicted:,.0f} | {interval} | {ratio:.2f} | {'no (in-sample)' if run.get('fitted') else 'yes'} |")
        key = (run["source"], *(run.get(k) for k in SETUP))
        groups.setdefault(key, []).append((run, o))
    summary = []
    if held:
        within = sum(abs(r - 1) <= 0.15 for r in held)
        summary.append(f"held out: {within} of {len(held)} within ±15 % (published / predicted "
                       f"{min(held):.2f}-{max(held):.2f})")
    for key, members in groups.items():
        if len(members) < 2:
            continue
        pick = max(members, key=lambda m: m[1]["tokens_per_s"])[0]
        best = max(members, key=lambda m: m[0]["tokens_per_s_per_gpu"])[0]
        summary.append(f"{key[0]}: plan picks {pick['checkpointing']} of {len(members)} published settings; "
                       f"regret {best['tokens_per_s_per_gpu'] / pick['tokens_per_s_per_gpu'] - 1:.1%}")
    return lines, summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=DEFAULT)
    args = p.parse_args(argv)
    try:
        with open(args.runs, "rb") as fh:
            runs = tomllib.load(fh).get("run", [])
    except (OSError, tomllib.TOMLDecodeError) as exc:
        print(f"{args.runs}: cannot read: {exc}", file=sys.stderr)
        return 2
    if not runs:
        print(f"{args.runs}: no [[run]] entries")
        return 0
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        print(f"{args.runs}: run: must be [[run]] tables", file=sys.stderr)
        return 2
    for i, run in enumerate(runs):
        missing = [k for k in ("source", *SETUP[:2], *SETUP[3:], "checkpointing", "tokens_per_s_per_gpu")
                   if k not in run and k not in ("ranks_per_host", "intra_host")]
        if missing:
            print(f"{args.runs}: run {i + 1}: {missing[0]}: missing", file=sys.stderr)
            return 2
        for key in ("world", "seq", "batch", "ranks_per_host"):
            if key in run and (not isinstance(run[key], int) or isinstance(run[key], bool) or run[key] < 1):
                print(f"{args.runs}: run {i + 1}: {key}: must be a whole number, got {run[key]!r}", file=sys.stderr)
                return 2
        figure = run["tokens_per_s_per_gpu"]
        if not isinstance(figure, (int, float)) or isinstance(figure, bool) or not figure > 0:
            print(f"{args.runs}: run {i + 1}: tokens_per_s_per_gpu: must be a positive number, got {figure!r}",
                  file=sys.stderr)
            return 2
    lines, summary = judge(runs)
    print("\n".join(lines + [""] + summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
