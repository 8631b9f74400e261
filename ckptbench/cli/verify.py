"""``ckptbench plan --verify``: the recommendation and its neighbours, run for real on this machine.

The recommended strategy at its largest batch and one batch below, and the runner-up at its largest
batch, run as an ordinary sweep (records, checks, report); the plan's predicted peak and step time are set
beside the measured ones, with the step time's error.  Nothing is fitted to these points: the step times
were predicted from the plan's baseline steps (:mod:`ckptbench.run.baselines`) before any of them ran,
so every point is held out, and the table says how far each prediction was.  Each record also carries the
sweep's own step-time prediction from the points run before it, as a check (``step_time_s``: agrees /
off, never a verdict).

``--calibration`` is read as ever (a card's measured matmul rate and copy bandwidth); nothing is written
to it any more (the old ``training_efficiency`` a previous --verify wrote is read and said to be unused).
"""

from __future__ import annotations

import dataclasses
import json
import os
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


def verify(args, planned, options, a, predict, timer=None) -> int:
    from ..run.sweep import SweepOptions, run_sweep
    from ..store.records import load_records
    from ..store.schema import typed
    from ..suite.parse import parse_suite
    from ..theory.policy.plan import step_seconds
    from ..theory.verdicts.annotate import annotate_record
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
    by_strategy = {(o.every_n_layers, o.offload): o for o in options}
    # every prediction is made before any verify point runs: none of them can have shaped it
    predicted = {c.id: step_seconds(c, a, predict, timer)[0] for c in cases}

    def annotate(case, record):  # each record keeps what the plan predicted for it
        annotate_record(case, record)
        seconds = predicted[case.id]
        record["plan_prediction"] = {
            "peak_bytes": predict.peak(case), "source": predict.source, "step_s": seconds,
            "step_time_source": a.step_time_source,
            "tokens_per_s": case.batch_size * case.seq_len / seconds if seconds else None,
            "max_batch": by_strategy[(case.every_n_layers, case.offload)].max_batch}

    run_sweep(suite, SweepOptions(out_dir=out), annotate=annotate)
    from ..store.files import write_text_atomic
    from ..theory.policy.plan import to_dict

    write_text_atomic(os.path.join(out, "plan.json"), json.dumps(to_dict(options, a, args.seq, spec.label), indent=2))
    print(f"\nverify ({out}): predicted vs measured on this machine, none of these points used to predict")
    print(f"{'strategy':<16} {'batch':>5} {'peak pred GiB':>13} {'peak meas GiB':>13} {'step pred s':>11} "
          f"{'step meas s':>11} {'error':>7}")
    errors = []
    measured_records = load_records(out).records
    for r in typed(measured_records):
        case = next(c for c in cases if c.id == r.case_id)
        m = r.measurement
        pred, meas = predicted[case.id], m.step_time_median_s
        error = pred / meas - 1 if pred and meas else None
        if error is not None:
            errors.append(abs(error))
        print(f"{case.strategy:<16} {case.batch_size:>5} {(predict.peak(case) or 0) / 2**30:>13.3f} "
              f"{(m.peak_bytes or 0) / 2**30:>13.3f} {pred or 0:>11.4f} {meas or 0:>11.4f} "
              f"{'-' if error is None else f'{error:+.1%}':>7}  {r.status}")
    if errors:
        print(f"step time: largest error {max(errors):.1%} over {len(errors)} points "
              f"(predicted from {a.step_time_source})")
    # what the measurements say is fastest, within the memory the plan fitted to (its peak allowance)
    from ..report.headline import summary_lines

    allowance = (a.memory_bytes - a.context_bytes) / (1 + a.reserved_margin)
    for line in summary_lines(measured_records, [(f" within the plan's {a.memory_bytes / 2**30:.2f} GiB (measured)",
                                                  allowance)]):
        print(line)
    if getattr(args, "html", None):  # the plan page again, each measured point beside its prediction
        from ..report.plan_section import plan_page

        write_text_atomic(args.html, plan_page({**to_dict(options, a, args.seq, spec.label),
                                                "memory_source": predict.source}, measured_records))
        print(f"plan page with the measured points: {args.html}")
    if args.calibration:
        print(f"{args.calibration}: read, not written (nothing is fitted to the verify points)")
    return 0
