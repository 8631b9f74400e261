"""Subcommands around a GPU run: ``calibrate``, ``simulate-suite`` and ``gpu-summary``.

Registered by :mod:`ckptbench.cli` with one call:

- ``calibrate RUN``: pinned host↔device bandwidth and a bf16 matmul peak, once per run, in its own process
  (sweep workers stay untouched), into ``RUN/calibration.json``.
- ``simulate-suite SUITE OUT``: FakeTensor predictions for every point into ``OUT/simulated.jsonl``.
- ``gpu-summary RUN``: MFU/HFU, recompute ratio vs ideal, offload overhead vs copy bound, estimate checks;
  printed, and stored as ``RUN/summary.json``.
"""

from __future__ import annotations

import os
import sys

from ..store.files import write_json_atomic

CALIBRATION = "calibration.json"
SUMMARY = "summary.json"


def cmd_calibrate(args) -> int:
    from ..base.errors import UsageError
    from ..measure.calibrate import calibrate, collective_rate

    if args.collective is not None and args.collective < 2:
        raise UsageError(f"--collective {args.collective}: a collective needs at least 2 processes")
    result = calibrate(args.size_mib, args.reps)
    path = os.path.join(args.run, CALIBRATION)
    if not result["available"]:
        print(f"calibrate: {result['reason']}; no copy or matmul measured", file=sys.stderr)
        result = {}
    else:
        print(f"calibrate: {result['device_name']}: H2D {result['h2d_bytes_per_s'] / 1e9:.1f} GB/s, "
              f"D2H {result['d2h_bytes_per_s'] / 1e9:.1f} GB/s (pinned, {args.size_mib} MiB), "
              f"bf16 matmul {result['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s")
    if args.collective:
        c = collective_rate(args.collective, args.size_mib * 2**20, args.reps)
        result.update(c)
        print(f"calibrate: all-reduce over {c['collective_world']} processes ({c['collective_backend']}): "
              f"{c['collective_bus_bytes_per_s'] / 1e9:.2f} GB/s bus bandwidth, {c['collective_latency_s'] * 1e6:.0f} us "
              "a hop")
    if not result:
        return 0
    os.makedirs(args.run, exist_ok=True)
    write_json_atomic(path, result)
    print(f"calibrate: -> {path}")
    return 0


def cmd_simulate_suite(args) -> int:
    from ..suite.parse import load_suite
    from ..theory.memory.simulated import simulate_suite

    suite = load_suite(args.suite)

    def on_line(line, k, total):
        sim = line.get("simulated") or {}
        peak = sim.get("peak_bytes")
        print(f"[{k}/{total}] {line['strategy']} b={line['batch_size']} s={line['seq_len']}: {line['status']}"
              + (f" peak {peak / 2**30:.2f} GiB" if peak else "") + (f" {line['reason']}" if line["reason"] else ""),
              flush=True)

    print(f"simulated: {simulate_suite(suite, args.out, on_line=on_line)}")
    return 0


def cmd_gpu_summary(args) -> int:
    from ..report.gpu_summary import format_summary, summarise
    from ..run.calibration import read_calibration
    from ..theory.memory.simulated import load_simulated
    from .report import require_records

    loaded = require_records(args.run, "summarise")
    for problem in loaded.problems:
        print(f"warning: {problem}", file=sys.stderr)
    # the run's calibration.json, {} when there is none (as for --verify, which writes it)
    calibration = read_calibration(os.path.join(args.run, CALIBRATION), verify=True, label="")
    summary = summarise(loaded.records, calibration, load_simulated(args.run))
    if os.path.isdir(args.run):
        write_json_atomic(os.path.join(args.run, SUMMARY), summary)
    print("\n".join(format_summary(summary)))
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("calibrate", help="measure pinned host-device bandwidth and bf16 matmul peak (CUDA)")
    p.add_argument("run", help="results directory to write calibration.json into")
    p.add_argument("--size-mib", type=int, default=256, help="copy size (default 256)")
    p.add_argument("--reps", type=int, default=5, help="timed copies each way (default 5)")
    p.add_argument("--collective", type=int, metavar="N",
                   help="also time a ring all-reduce between N processes here (NCCL across N GPUs, else gloo): "
                        "the bus bandwidth and latency `plan --calibration` uses for --world")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("simulate-suite", help="FakeTensor predictions for every point of a suite (no GPU)")
    p.add_argument("suite", help="suite file")
    p.add_argument("out", help="directory for simulated.jsonl (a results directory, or one to carry there)")
    p.set_defaults(func=cmd_simulate_suite)

    p = sub.add_parser("gpu-summary", help="MFU/HFU, recompute and offload costs, estimate checks of a run")
    p.add_argument("run", help="results directory")
    p.set_defaults(func=cmd_gpu_summary)
