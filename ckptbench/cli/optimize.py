"""``ckptbench plan --optimize``: the best per-layer checkpointing policy under the budget, found exactly
(:mod:`ckptbench.theory.policy.optimize`), set beside the best of the strategies ``plan`` ranks, and handed over as
``TrainingArguments`` keywords, a ``policy.py`` and a suite (:mod:`.handover`); ``--verify`` runs the optimum
and the best ranked strategy as a sweep here and sets measured beside predicted.

    ckptbench plan --optimize --model llama-small --device cpu --memory 0.09GiB --seq 512 --verify
    ckptbench plan --optimize --model llama-8b --device h100 --seq 8192 --lora 16
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

from ..base.errors import UsageError
from .handover import policy_name

GIB = 2**30
_name = policy_name


def add_parser(sub) -> None:
    """``plan``'s parser (:func:`.plan.add_parser`) with --optimize and its flags; ``plan`` runs as before
    without them."""
    from . import plan

    plan.add_parser(sub)
    p = sub.choices["plan"]
    add_flags(p)
    p.set_defaults(func=lambda args: cmd_optimize(args) if optimizing(args) else plan.cmd_plan(args))


def add_flags(p) -> None:
    p.add_argument("--optimize", action="store_true",
                   help="find the per-layer policy (which layers to checkpoint, how, at which batch) of highest "
                        "predicted tokens/s within the budget, exactly, beside the best ranked strategy")
    p.add_argument("--host-memory", metavar="SIZE",
                   help="with --optimize: host RAM the offloaded activations of the ranks on one host may use")
    p.add_argument("--pinned-memory", metavar="SIZE",
                   help="with --optimize: pinned host memory the offloaded activations may use")
    p.add_argument("--compile-budgets", metavar="B,B,...",
                   help="with --optimize --verify: also measure torch.compile at these activation memory budgets "
                        "(0..1) at the optimum's batch, reported as the measured curve beside the optimum")
    p.add_argument("--handover", metavar="DIR",
                   help="with --optimize: write policy.py, optimum.toml (and training_args.json where "
                        "transformers can say the policy) here (with --verify: the results directory)")


def optimizing(args) -> bool:
    """Whether the plan is --optimize; its own flags without it are refused."""
    if not args.optimize:
        for flag in ("host_memory", "pinned_memory", "handover", "compile_budgets"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')}: only with --optimize")
    return args.optimize


def compile_budgets(args) -> list[float]:
    """--compile-budgets 0,0.5,1: each a number in [0, 1], with --verify only."""
    from ..point.strategy import compile_budget_problem

    if not args.compile_budgets:
        return []
    if not args.verify:
        raise UsageError("--compile-budgets: only with --verify (a budget's peak is known only once it compiles)")
    out = []
    for text in args.compile_budgets.split(","):
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"--compile-budgets: {text!r} is not a number") from None
        if compile_budget_problem(value):
            raise UsageError(f"--compile-budgets: {compile_budget_problem(value)}")
        out.append(value)
    return sorted(set(out))


def _size(flag: str, text: str | None) -> int | None:
    from .plan import parse_bytes

    if text is None:
        return None
    try:
        return parse_bytes(text)
    except UsageError as exc:
        raise UsageError(str(exc).replace("--memory", flag)) from None


def host_budget(args, world: int):
    from ..theory.policy.optimize import HostBudget

    ranks = args.ranks_per_host or min(world, 8)
    return HostBudget(_size("--pinned-memory", args.pinned_memory), _size("--host-memory", args.host_memory), ranks)


def _refuse_flags(args) -> None:
    for flag, value in (("--html", args.html), ("--layer-sets", args.layer_sets)):
        if value:
            raise UsageError(f"{flag}: not with --optimize (its comparison ranks layer sets itself; no page yet)")
    if args.local_sgd_steps:
        raise UsageError("--local-sgd-steps: not with --optimize (the optimizer plans ranks that step together)")


def cmd_optimize(args) -> int:
    from ..point.case import analytic_point
    from ..theory.policy import plan as planner
    from ..theory.policy.optimize import optimize
    from .plan import assumptions, not_ranked, predictor, sac_policies, streams
    from .planspeed import step_timer

    _refuse_flags(args)
    budgets = compile_budgets(args)
    case, a = assumptions(args)
    host = host_budget(args, a.world)
    t0 = time.perf_counter()
    sac = sac_policies(args.sac)
    # the search is at one length: no fit across lengths (its simulations at 2x and 4x the length cost most)
    predict = predictor(case.model, args.seq, a, args.simulate, case.setup, sac, across=False)
    timer = step_timer(args, a, case.train.threads)
    modes = ("",) + (("offload",) if a.device == "cuda" else ()) + tuple(f"sac-{p}" for p in sac)
    sets = a.sharding == "ddp" and analytic_point(case.model, case.setup, a.device) and not args.simulate
    options = planner.plan(case.model, args.seq, a, predict=predict, setup=case.setup, layer_sets=bool(sets),
                           timer=timer, sac=sac, streamed=streams(a, predict))
    ranked_s = time.perf_counter() - t0
    result = optimize(case, a, predict, timer, modes, host)
    a = dataclasses.replace(a, step_time_source=timer.source)
    took = time.perf_counter() - t0
    ranked = next((o for o in options if o.max_batch and o.tokens_per_s), None)
    summary = to_dict(case, result, ranked, a, predict, took, ranked_s)
    # the best of what every_n_layers can say (plan's ranking without --layer-sets), beside the layer sets'
    every_n = next((o for o in options if o.max_batch and o.tokens_per_s and not o.layers and not o.sac), None)
    summary["best_every_n"] = None if every_n is None else dataclasses.asdict(every_n)
    if every_n is not None and result.best is not None:
        summary["gap_every_n"] = result.best.tokens_per_s / every_n.tokens_per_s - 1
    summary["not_searched"] = not_searched(a, sac, not_ranked(a, predict, sac))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(render(case, args.seq, a, result, ranked, summary))
    out = args.handover or (args.out or os.path.join("results", f"plan-optimum-{time.strftime('%Y%m%d-%H%M%S')}")
                            if args.verify else None)
    if result.best is None:
        return 1 if args.verify else 0
    if out:
        files = write_handover(out, args, case, a, result.best, summary)
        print(f"handed over: {', '.join(files)}", file=sys.stderr)
    if args.verify:
        from .verify_optimum import verify_optimum

        return verify_optimum(args, case, a, predict, result.best, ranked, out, budgets, every_n)
    return 0


def not_searched(a, sac, left_out: dict) -> dict:
    out = {k: v for k, v in left_out.items() if k in ("compile-budget", "sac")}
    out["offload-streamed"] = ("not searched: streamed offload's prefetch makes a layer's moment depend on the "
                               "checkpointed layers above it, and transformers cannot express it")
    if a.device != "cuda":
        out["offload"] = "not searched on a CPU: nothing is copied, it is the plain policy to the byte"
    out["mixed modes"] = ("one mode per model: transformers' offload and a SAC policy are one setting for every "
                          "checkpointed layer")
    return out


def to_dict(case, result, ranked, a, predict, took: float, ranked_s: float) -> dict:
    best = result.best
    out = {"model": case.model.label, "seq_len": case.seq_len, "memory_bytes": a.memory_bytes, "device": a.device,
           "memory_source": predict.source, "step_time_source": a.step_time_source, "proof": result.proof,
           "optimality_gap": result.optimality_gap, "gap_bound": result.gap_bound,
           "bound_tokens_per_s": result.bound_tokens_per_s, "undetermined_sets": result.undetermined,
           "optimizing_s": round(took, 2), "ranking_s": round(ranked_s, 2),
           "optimum": None if best is None else {**dataclasses.asdict(best), "policy": _name(best)},
           "per_batch": [{**dataclasses.asdict(s), "policy": _name(s)} for s in result.per_batch],
           "refused": [{"policy": _name(s), "batch": s.batch, "tokens_per_s": s.tokens_per_s, "why": why}
                       for s, why in result.refused],
           "best_ranked": None if ranked is None else dataclasses.asdict(ranked)}
    if best is not None and ranked is not None:
        out["gap"] = best.tokens_per_s / ranked.tokens_per_s - 1
    return out


def render(case, seq: int, a, result, ranked, summary: dict) -> str:
    from .planview import run_label

    lines = [f"{run_label(case)} at seq {seq}, {a.memory_bytes / GIB:.4g} GiB on {a.device_name or a.device}"
             + (f" × {a.world} ranks ({a.sharding})" if a.world > 1 else "")]
    lines.append(f"{'batch':>5} {'best policy at this batch and mode':<44} {'peak GiB':>9} {'step s':>8} {'tokens/s':>10}")
    # one row per policy and batch: a mode's best may check nothing (offload's best at batch 1 is then none)
    rows = {(s.batch, _name(s)): s for s in sorted(result.per_batch, key=lambda s: s.tokens_per_s)}
    for s in sorted(rows.values(), key=lambda s: -s.tokens_per_s)[:12]:
        lines.append(f"{s.batch:>5} {_name(s):<44} {s.peak_bytes / GIB:>9.3f} {s.step_s:>8.3f} "
                     f"{s.tokens_per_s:>10,.0f}")
    best = result.best
    if best is None:
        lines.append("optimum: nothing fits: not even batch 1 with every layer checkpointed")
    else:
        check = best.checked
        lines.append(f"optimum: {_name(best)} at batch {best.batch}: {best.tokens_per_s:,.0f} tokens/s predicted, "
                     f"peak {best.peak_bytes / GIB:.3f} GiB"
                     + (f", {best.host_bytes / GIB:.2f} GiB offloaded per rank" if best.host_bytes else "")
                     + ("" if check["peak_agrees"] and check["step_additive"] else
                        f" (asked again at the optimum: peak {check['peak_bytes']} B, step {check['step_s']:.4f} s)"))
    if ranked is not None and best is not None:
        lines.append(f"best ranked strategy: {ranked.strategy} at batch {ranked.max_batch}: "
                     f"{ranked.tokens_per_s:,.0f} tokens/s predicted; the optimum is {summary['gap']:+.1%}")
    every_n = summary.get("best_every_n")
    if every_n and best is not None and ranked is not None and every_n["strategy"] != ranked.strategy:
        lines.append(f"best every-n strategy: {every_n['strategy']} at batch {every_n['max_batch']}: "
                     f"{every_n['tokens_per_s']:,.0f} tokens/s predicted; the optimum is {summary['gap_every_n']:+.1%}")
    for sol, why in result.refused:
        lines.append(f"refused: {_name(sol)} at batch {sol.batch} ({sol.tokens_per_s:,.0f} tokens/s) breaks {why}")
    lines.append(f"proof: {result.proof}")
    lines.append(f"memory: {summary['memory_source']}; step time: {a.step_time_source}")
    for name, why in summary.get("not_searched", {}).items():
        lines.append(f"{name}: {why}")
    lines.append(f"optimized in {summary['optimizing_s']:.1f} s (building the predictor and ranking the strategies "
                 f"{summary['ranking_s']:.1f} s "
                 "of it)")
    return "\n".join(lines)


def write_handover(out: str, args, case, a, best, summary: dict) -> list[str]:
    from ..store.files import write_text_atomic
    from .handover import policy_file, suite_file, training_arguments
    from .planview import run_label
    from .quick import model_lines, train_lines

    sac = best.mode[4:] if best.mode.startswith("sac-") else ""
    offload = best.mode == "offload"
    title = (f"Checkpointing policy for {run_label(case)} at seq {case.seq_len}, batch {best.batch}, "
             f"within {a.memory_bytes / GIB:.2f} GiB on {a.device_name or a.device}.")
    why = (f"{best.tokens_per_s:,.0f} tokens/s and a peak of {best.peak_bytes / GIB:.3f} GiB predicted "
           f"({summary['memory_source']})")
    files = {"policy.py": policy_file(title, why, best.layers, offload, sac, best.batch)}
    lines = model_lines(args.model, layers=args.layers, precision=case.precision, attn=case.model.attn)
    budget = round(a.memory_bytes / GIB, 9) if a.device == "cpu" else None
    files["optimum.toml"] = suite_file("plan-optimum", "cpu" if a.device == "cpu" else "cuda", lines,
                                       train_lines(args), best.batch, case.seq_len, best.layers, offload, sac,
                                       budget, f"plan --optimize: {_name(best)} at batch {best.batch}")
    kwargs = training_arguments(best.layers, case.model.layers, offload, sac, best.batch)
    if kwargs is not None:
        files["training_args.json"] = json.dumps(kwargs, indent=2) + "\n"
    files["optimum.json"] = json.dumps(summary, indent=2, default=str) + "\n"
    try:
        os.makedirs(out, exist_ok=True)
        for name, text in files.items():
            write_text_atomic(os.path.join(out, name), text)
    except OSError as exc:
        raise UsageError(f"--handover {out}: cannot write: {exc.strerror or exc}") from None
    return [os.path.join(out, name) for name in files]
