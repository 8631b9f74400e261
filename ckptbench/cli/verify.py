"""``ckptbench plan --verify``: the recommendation and its neighbours, run for real on this machine.

The recommended strategy at its largest batch and one batch below, and the runner-up at its largest
batch, run as an ordinary sweep (records, checks, report); the plan's predicted peak and tokens/s are set
beside the measured ones, and the measured training efficiency (predicted step time × assumed efficiency /
measured step time, the median over the points) is written to ``--calibration`` so the next plan uses it.

On a CPU the efficiency is a fraction of the matmul rate measured right before and right after the steps
(the higher of the two), not of the rate the plan measured: a rate taken under another load would make it
anything, above 1 included.  An efficiency that is not a fraction in (0, 1] is never written; the command
says why in one line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time


def _suite_text(spec_line: str, device: str, points: list[tuple[int, int, bool]], seq: int,
                loop: str = "manual") -> str:
    """One suite per verify run; each (every_n, batch, offload) triple is a sweep of its own axis values."""
    batches = sorted({b for _, b, _ in points})
    every_n = sorted({n for n, _, _ in points})
    offload = sorted({o for _, _, o in points})
    return (f'[suite]\nname = "plan-verify"\ndevice = "{device}"\n[model]\n{spec_line}\n'
            f'[train]\nwarmup_steps = 1\nmemory_steps = 1\nsteps = 3\nloop = "{loop}"\n'
            f"[sweep]\nbatch_size = {batches}\nseq_len = [{seq}]\nevery_n_layers = {every_n}\n"
            f"offload = [{', '.join('true' if o else 'false' for o in offload)}]\n")


def calibrated_efficiency(assumed: float, ratios: list[float]) -> tuple[float | None, str]:
    """(the measured training efficiency, "") or (None, why none may be written)."""
    if not ratios:
        return None, "no point has both a predicted and a measured step time"
    efficiency = assumed * statistics.median(ratios)
    if not math.isfinite(efficiency) or efficiency <= 0:
        return None, f"the measured efficiency came out {efficiency}, not a fraction of the peak"
    if efficiency > 1:
        return None, (f"the measured efficiency {efficiency:.0%} of the peak FLOP/s is above 100%: "
                      "the rate and the steps were not measured under the same conditions")
    return efficiency, ""


def _rate_beside_steps(planned, seq: int) -> tuple[float | None, str]:
    """This CPU's matmul rate now, in the dtype and thread count the verify steps run with."""
    from ..run import calibration

    return calibration.cpu_matmul_rate(planned.model, seq, planned.compute_dtype, planned.train.threads)


def verify(args, planned, options, a, predict) -> int:
    from ..run.calibration import read_calibration
    from ..run.sweep import SweepOptions, run_sweep
    from ..store.records import load_records
    from ..suite import parse_suite
    from ..theory.annotate import annotate_record
    from ..theory.plan import step_seconds
    from .quick import model_lines

    fitting = [o for o in options if o.max_batch and o.tokens_per_s]
    if not fitting:
        print("verify: nothing fits, nothing to run")
        return 1
    best = fitting[0]
    wanted = [(best.every_n_layers, best.max_batch, best.offload)]
    if best.max_batch > 1:
        wanted.append((best.every_n_layers, best.max_batch - 1, best.offload))
    if len(fitting) > 1:
        wanted.append((fitting[1].every_n_layers, fitting[1].max_batch, fitting[1].offload))
    spec = planned.model  # the plan's Case: its model, precision and loop are what runs
    lines = model_lines(args.model, layers=args.layers, precision=planned.precision, attn=spec.attn)
    suite = parse_suite(_suite_text("\n".join(lines), a.device, wanted, args.seq, planned.setup.loop),
                        "plan --verify")
    cases = [c for c in suite.cases if (c.every_n_layers, c.batch_size, c.offload) in wanted]
    suite = dataclasses.replace(suite, cases=tuple(cases))
    out = args.out or os.path.join("results", f"plan-verify-{time.strftime('%Y%m%d-%H%M%S')}")
    predicted = {(o.every_n_layers, o.offload): o for o in options}

    def annotate(case, record):  # each record keeps what the plan predicted for it
        annotate_record(case, record)
        seconds, _ = step_seconds(case, a, predict)
        record["plan_prediction"] = {
            "peak_bytes": predict.peak(case), "source": predict.source,
            "tokens_per_s": case.batch_size * case.seq_len / seconds if seconds else None,
            "max_batch": predicted[(case.every_n_layers, case.offload)].max_batch}

    rates = [_rate_beside_steps(planned, args.seq)] if a.device == "cpu" else []
    run_sweep(suite, SweepOptions(out_dir=out), annotate=annotate)
    rates += [_rate_beside_steps(planned, args.seq)] if a.device == "cpu" else []
    # the efficiency is measured against the rate of the moment the steps ran in, not the plan's
    here, rate_note = a, a.sources.get("peak_flops_per_s", "")
    if rates:
        measured = [r for r, _ in rates if r]
        here = dataclasses.replace(a, peak_flops_per_s=max(measured) if measured else None)
        shown = ", ".join(f"{r / 1e9:.1f}" if r else "none" for r, _ in rates)
        rate_note = (f"{max(measured) / 1e9:.1f} GFLOP/s, the higher of the matmul rates measured before and "
                     f"after the steps ({shown})" if measured else f"no matmul rate beside the steps: {rates[-1][1]}")
    from ..store.files import write_text_atomic
    from ..theory.plan import to_dict

    write_text_atomic(os.path.join(out, "plan.json"), json.dumps(to_dict(options, a, args.seq, spec.label), indent=2))
    print(f"\nverify ({out}): predicted vs measured on this machine")
    print(f"{'strategy':<16} {'batch':>5} {'peak pred GiB':>13} {'peak meas GiB':>13} {'tok/s pred':>10} {'tok/s meas':>10}")
    ratios = []
    measured_records = load_records(out).records
    for r in measured_records:
        case = next(c for c in cases if c.id == r["case_id"])
        predicted_s, _ = step_seconds(case, a, predict)
        m = r.get("measurement") or {}
        est = predict.peak(case)
        tokens = case.batch_size * case.seq_len
        measured_tps = m.get("tokens_per_s")
        beside_s, _ = step_seconds(case, here, predict)
        if beside_s and m.get("step_time_median_s"):
            ratios.append(beside_s / m["step_time_median_s"])
        print(f"{case.strategy:<16} {case.batch_size:>5} {(est or 0) / 2**30:>13.3f} "
              f"{(m.get('peak_bytes') or 0) / 2**30:>13.3f} {tokens / predicted_s if predicted_s else 0:>10,.0f} "
              f"{measured_tps or 0:>10,.0f}  {r['status']}")
    # what the measurements say is fastest, within the memory the plan fitted to (its peak allowance)
    from ..report.headline import summary_lines

    allowance = (a.memory_bytes - a.context_bytes) / (1 + a.reserved_margin)
    for line in summary_lines(measured_records, [(f" within the plan's {a.memory_bytes / 2**30:.2f} GiB (measured)",
                                                  allowance)]):
        print(line)
    if args.calibration:
        efficiency, why = calibrated_efficiency(a.efficiency, ratios)
        if efficiency is None:
            print(f"no calibration written to {args.calibration}: {why} (peak: {rate_note})")
            return 0
        cal = read_calibration(args.calibration, verify=True)  # the file plan read and checked, or {} when new
        cal.update(training_efficiency=efficiency, training_efficiency_points=len(ratios),
                   training_efficiency_from=out, training_efficiency_peak=rate_note)
        write_text_atomic(args.calibration, json.dumps(cal, indent=2))
        print(f"measured training efficiency {efficiency:.1%} of the peak FLOP/s ({rate_note}) -> {args.calibration}")
    return 0
