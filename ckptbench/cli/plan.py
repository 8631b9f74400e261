"""``ckptbench plan``: which checkpointing setting fits a card (or this CPU) and is fastest, predicted.

    ckptbench plan --model llama-8b --device h100 --seq 8192 --dtype bf16 --attn sdpa
    ckptbench plan --model llama-small --memory 0.5GiB --seq 512          (this machine's CPU)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context

from ..base.errors import UsageError
from .argtypes import at_least_one, at_least_zero

UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6,
         "gb": 10**9, "tb": 10**12}


def parse_bytes(text: str) -> int:
    """'80GiB', '141GB', '512 MiB', '1e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise UsageError(f"--memory takes a size such as 80GiB or 141GB, got {text!r}")
    try:
        value = float(m.group(1)) * UNITS[m.group(2).lower()]
    except ValueError:
        raise UsageError(f"--memory takes a size such as 80GiB or 141GB, got {text!r}") from None
    if not math.isfinite(value) or value < 1:
        raise UsageError(f"--memory: must be a finite size of at least one byte, got {text!r}")
    return int(value)


def _case(args):
    """A Case of the model and setup the flags describe, through the same rules as a suite file."""
    from dataclasses import replace

    from ..suite.parse import parse_suite
    from .quick import model_flag, model_lines, precision_flag, train_lines

    device = "cpu" if args.device == "cpu" else "cuda"
    text = (f'[suite]\ndevice = "{device}"\n[model]\n'
            + "\n".join(model_lines(args.model, layers=args.layers, dtype=args.dtype, attn=args.attn,
                                     precision=precision_flag(args)))
            + "\n[train]\n" + "\n".join(train_lines(args))
            + f"\n[sweep]\nbatch_size = [1]\nseq_len = [{args.seq}]\n")
    case = parse_suite(text, model_flag(args.model)).cases[0]
    # the planned step is one rank's; how the ranks share state rides on the setup
    return replace(case, setup=replace(case.setup, sharding=args.sharding))


def predictor(spec, seq: int, a, force_simulation: bool, setup=None, sac: tuple[str, ...] = (), across: bool = True):
    """The analytic estimate where it describes the point (:func:`~ckptbench.point.case.analytic_point`: a family
    that has one under the manual loop, pure or bf16-mixed) unless --simulate, else the few-layer FakeTensor
    simulation extrapolated to full depth; with `sac`, each policy's own few-layer fit beside it
    (:class:`~ckptbench.theory.policy.planstrategies.PerStrategy`).  `across`: fit batch 1 across sequence lengths too
    (the longest length each strategy reaches; its simulations at 2 and 4 times `seq` are the slowest)."""
    from ..point.case import analytic_point, analytic_sharded_point
    from ..point.setup import Setup
    from ..theory.policy import plan as planner

    setup = setup or Setup()
    sharded = None
    if a.sharding == "fsdp":
        if not analytic_sharded_point(spec, setup, a.device) or force_simulation:
            raise UsageError("--sharding fsdp is planned from the analytic estimate of one rank: llama, qwen2 or "
                             "gpt2 shapes in a pure precision (--precision bf16 or fp32) or bf16-mixed (FSDP2's "
                             "MixedPrecisionPolicy) under the manual loop, full fine-tuning with AdamW")
        sharded = planner.ShardedAnalytic(a.world)
        if not sac:
            return sharded
    base = planner.Analytic() if analytic_point(spec, setup, a.device) and not force_simulation else None
    if base is not None and not sac:
        return base
    from ..point.strategy import Recompute
    from ..theory.memory import simulate as _preload  # noqa: F401  (imported once, inherited by the forked simulators)
    from ..theory.memory.extrapolate import NotAffine, Simulated, SimulationFailed, extrapolation
    from ..theory.policy.planstrategies import PerStrategy

    offloads = (False, True) if a.device == "cuda" else (False,)
    # every few-layer step is independent: one process per core simulates them
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=get_context("fork")) as pool:
        def fitted(recompute, what: str):
            try:
                return Simulated(extrapolation(spec, seq, a.device, offloads=offloads, mapper=pool.map, setup=setup,
                                               recompute=recompute, across=across))
            except (NotAffine, SimulationFailed) as exc:
                raise UsageError(f"cannot plan {what} of {spec.label} from a few-layer simulation: {exc}") from None
            except BrokenProcessPool:
                raise UsageError(f"cannot plan {spec.label}: a simulation process died (out of memory?) before it "
                                 "could say why") from None

        base = base or fitted(Recompute(), "the strategies")
        if not sac:
            return base
        policies = {p: fitted(Recompute(sac=p), f"SAC policy {p}") for p in sac}
        if sharded is not None:
            from ..theory.policy.planstrategies import ShardedPerStrategy

            return ShardedPerStrategy(sharded, base, policies)
        return PerStrategy(base, policies)


def sac_policies(text: str | None) -> tuple[str, ...]:
    """``--sac save-matmuls,save-attention`` or ``--sac all``: the named policies, each once, in order."""
    from ..point.strategy import SAC_POLICIES

    if not text:
        return ()
    names = list(SAC_POLICIES) if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SAC_POLICIES]
    if unknown or not names:
        raise UsageError(f"--sac {text}: {'unknown policy ' + repr(unknown[0]) if unknown else 'no policy named'}; "
                         f"the policies are {', '.join(SAC_POLICIES)} (or all)")
    return tuple(dict.fromkeys(names))


def not_ranked(a, predict, sac: tuple[str, ...], verify: bool = False) -> dict[str, str]:
    """The strategies this plan leaves out, each with why (:data:`~ckptbench.theory.policy.planstrategies.NOT_RANKED`)."""
    from ..theory.policy.planstrategies import NOT_RANKED

    out = dict(NOT_RANKED)
    if not sac:
        out["sac"] = ("not ranked unless asked: each policy is planned from its own few-layer simulation "
                      "(--sac save-matmuls,... or --sac all)")
    if a.device == "cuda" and verify:
        out["offload-streamed"] = ("not ranked with --verify, which runs the every-n settings with transformers' "
                                   "offload")
    elif a.device == "cuda" and not streams(a, predict):
        out["offload-streamed"] = ("not ranked for this plan: streamed offload's prefetch is in the analytic "
                                   "estimate of one unsharded rank only (the few-layer fit does not carry it)")
    elif a.device != "cuda":
        out["offload-streamed"] = "not ranked on a CPU: nothing is copied, it is +offload to the byte"
    return out


def streams(a, predict) -> bool:
    """Whether the plan ranks streamed offload: a CUDA plan of one unsharded rank from the analytic estimate."""
    from ..theory.policy import plan as planner
    from ..theory.policy.planstrategies import PerStrategy

    base = predict.base if isinstance(predict, PerStrategy) else predict
    return a.device == "cuda" and a.sharding == "ddp" and type(base) is planner.Analytic


def _check_html(path: str | None) -> None:
    """Refuse an --html path that cannot be written before the plan is computed, not after."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"--html {path}: is a directory")
    if not os.path.isdir(folder):
        raise UsageError(f"--html {path}: no directory {folder}")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--html {path}: cannot write in {folder}")


def _measured_margins(a: dict, sources: dict, run_dir: str) -> None:
    """Replace the CUDA margins in `a` by those a CUDA run's records measured."""
    from ..store.records import load_records
    from ..theory.memory.margins import MAX_DEVICE_BYTES, measured_margins

    loaded = load_records(run_dir)
    for note in loaded.notes():
        if "no records file" not in note:
            print(f"warning: {note}", file=sys.stderr)
    margin, context, used, rejected = measured_margins(loaded.records)
    if rejected:
        print(f"warning: {run_dir}: {rejected} ok CUDA record{'s' * (rejected > 1)} whose allocator or context "
              f"figures are not byte counts a card measured (not finite, negative, over "
              f"{MAX_DEVICE_BYTES:.3g} B, or reserved below allocated): left out", file=sys.stderr)
    if margin is None and context is None:
        raise UsageError(f"{run_dir}: no ok CUDA record with allocator or NVML figures to measure the margins from")
    if margin is not None:
        a["reserved_margin"] = margin
        sources["reserved_margin"] = f"measured in {run_dir} ({used} points, the largest)"
    if context is not None:
        a["context_bytes"] = context
        sources["context_bytes"] = f"measured in {run_dir} ({used} points, the largest)"


def assumptions(args):
    from ..run.calibration import calibrated_link, read_calibration
    from ..theory.policy import plan as planner

    if args.sharding == "fsdp" and (args.world < 2 or args.local_sgd_steps):
        raise UsageError("--sharding fsdp: shards state over --world N > 1 ranks that step together "
                         "(no --local-sgd-steps)")
    case = _case(args)
    compute = case.compute_dtype
    cal = read_calibration(args.calibration, args.verify)
    sources = {}
    a = {"world": args.world, "local_sgd_steps": args.local_sgd_steps, "network": args.network,
         "sharding": args.sharding, "ranks_per_host": args.ranks_per_host or 8, "intra": args.intra_host}
    if args.world > 1:
        from .planspeed import network_of

        a["measured_link"] = network_of(args, cal, sources)
    if cal.get("training_efficiency"):  # what an older --verify wrote: read, and said to be unused
        sources["training_efficiency"] = (f"{cal['training_efficiency']:.0%} in {args.calibration}, from an older "
                                          "--verify: not used, step times come from measured baseline steps")
    if args.device == "cpu":
        if not args.memory:
            raise UsageError("--device cpu needs --memory (the budget to plan for)")
        return case, planner.Assumptions(parse_bytes(args.memory), "cpu", None, **a, sources=sources)
    name = planner.CARDS[args.device][0]
    peak = planner.datasheet_peak(name, compute)
    a.update(memory_bytes=parse_bytes(args.memory) if args.memory else planner.DEVICE_MEMORY[args.device],
             device="cuda", device_name=name, reserved_margin=planner.CUDA_RESERVED_MARGIN,
             context_bytes=planner.CUDA_CONTEXT_BYTES, peak_flops_per_s=peak)
    sources.update(memory_bytes="--memory" if args.memory else f"what torch sees on an {name}",
                   peak_flops_per_s=f"datasheet {name} {compute}" if peak else "unknown",
                   reserved_margin="default", context_bytes="default", link_bytes_per_s="default")
    if args.from_run:
        _measured_margins(a, sources, args.from_run)
    if cal.get("matmul_flops_per_s"):
        a["peak_flops_per_s"] = cal["matmul_flops_per_s"]
        sources["peak_flops_per_s"] = f"calibration {args.calibration}"
    link = calibrated_link(cal)
    if link:
        a["link_bytes_per_s"] = link
        sources["link_bytes_per_s"] = f"calibration {args.calibration}"
    return case, planner.Assumptions(**a, sources=sources)


def cmd_plan(args) -> int:
    from ..theory.policy import plan as planner
    from .planview import render, run_label

    _check_html(args.html)
    case, a = assumptions(args)
    spec = case.model
    t0 = time.perf_counter()
    sac = sac_policies(args.sac)
    if sac and args.verify:
        raise UsageError("--sac: not with --verify (which measures every_n_layers settings)")
    from ..point.case import analytic_point

    if args.layer_sets and (args.verify or args.simulate or a.sharding != "ddp"
                            or not analytic_point(spec, case.setup, a.device)):
        raise UsageError("--layer-sets: planned from the analytic estimate of an unsharded point, without --verify "
                         "(which measures every_n_layers settings)")
    # at a fixed --batch the longest sequence at batch 1 answers nothing asked: its fit across lengths (half
    # the simulations, and the slowest) is left out, and the output says so
    predict = predictor(spec, args.seq, a, args.simulate, case.setup, sac, across=not args.batch)
    from .planspeed import step_timer

    timer = step_timer(args, a, case.train.threads)
    options = planner.plan(spec, args.seq, a, predict=predict, setup=case.setup, layer_sets=args.layer_sets,
                           timer=timer, sac=sac, streamed=streams(a, predict) and not args.verify,
                           batch=args.batch or 0)
    if args.batch and not any(o.batch for o in options):
        largest = max(options, key=lambda o: o.max_batch)
        raise UsageError(f"--batch {args.batch}: no strategy fits it at seq {args.seq} on "
                         f"{a.memory_bytes / 2**30:.2f} GiB (the largest: batch {largest.max_batch}, "
                         f"{largest.strategy})")
    a = dataclasses.replace(a, step_time_source=timer.source)
    why = "" if any(o.max_batch for o in options) else planner.nothing_fits(spec, args.seq, a, predict, case.setup)
    took = time.perf_counter() - t0
    label = run_label(case)
    left_out = not_ranked(a, predict, sac, args.verify)
    if args.json:
        print(json.dumps({**planner.to_dict(options, a, args.seq, label, why), "memory_source": predict.source,
                          "precision": case.precision, "loop": case.setup.loop, "planning_s": round(took, 2),
                          "not_ranked": left_out}, indent=2))
    else:
        print(render(case, args.seq, options, a, why))
        print(f"memory and FLOPs: {predict.source}; planned in {took:.1f} s")
        for why in sorted(set(predict.max_seq_unknown())):
            print(f"max seq @b1 not predicted: {why}")
        for name, why in left_out.items():
            print(f"{name}: {why}")
    if args.html:
        from ..report.plan_section import plan_page
        from ..store.files import write_text_atomic

        try:
            write_text_atomic(args.html, plan_page({**planner.to_dict(options, a, args.seq, label, why),
                                                    "memory_source": predict.source, "not_ranked": left_out}))
        except OSError as exc:
            raise UsageError(f"--html {args.html}: cannot write: {exc.strerror or exc}") from None
        print(f"plan page: {args.html}", file=sys.stderr)
    if args.verify:
        from .verify import verify

        return verify(args, case, options, a, predict, timer)
    return 0


def add_parser(sub) -> None:
    from .quick import add_precision_flags

    p = sub.add_parser("plan", help="the fastest checkpointing setting that fits a card or a memory budget")
    p.add_argument("--model", required=True, help="a preset, a config.json (or directory), or a hub name")
    p.add_argument("--seq", type=int, required=True, help="sequence length")
    from ..point.cards import CARDS

    p.add_argument("--device", default="h100", choices=("cpu", *CARDS),
                   help="the card (the memory torch sees on it, its datasheet FLOP/s), or cpu with --memory "
                        "(default h100; a100 is the 80 GB A100)")
    p.add_argument("--memory", help="memory to plan for, e.g. 80GiB (default: the card's)")
    p.add_argument("--layers", type=int, help="override the model's layer count")
    add_precision_flags(p)
    p.add_argument("--attn", choices=("eager", "sdpa"))
    p.add_argument("--calibration", help="a `ckptbench calibrate` JSON of the card: its measured matmul rate and "
                                         "copy bandwidth replace the datasheet's")
    p.add_argument("--baselines-dir", "--rates-dir", dest="rates_dir", default=os.path.join("results", "baselines"),
                   metavar="DIR", help="where the baseline steps measured here are kept between plans "
                                       "(default results/baselines)")
    p.add_argument("--from-run", metavar="DIR",
                   help="a CUDA run's results: its measured allocator reserve and CUDA context replace the defaults")
    p.add_argument("--simulate", action="store_true",
                   help="plan from the few-layer FakeTensor simulation even where an analytic estimate exists "
                        "(models without one always are)")
    p.add_argument("--world", type=at_least_one, default=1, metavar="N",
                   help="data-parallel ranks: each holds the whole model and DDP's gradient buckets; tokens/s "
                        "is that of all ranks, with the gradient (or, with --local-sgd-steps, parameter) "
                        "all-reduce projected on --network")
    p.add_argument("--sharding", choices=("ddp", "fsdp"), default="ddp",
                   help="with --world: ddp (each rank holds the whole model) or fsdp (FSDP2: parameters, "
                        "gradients and optimizer state sharded over the ranks); memory is per rank")
    p.add_argument("--local-sgd-steps", type=at_least_zero, default=0, metavar="K",
                   help="with --world: average parameters every K steps instead of gradients every step")
    from ..theory.comm.network import LINKS

    p.add_argument("--network", default="NVLink", choices=[k.name for k in LINKS],
                   help="the link between ranks for --world (default NVLink); past --ranks-per-host, the network "
                        "between hosts (an InfiniBand or Ethernet rate per GPU)")
    p.add_argument("--ranks-per-host", type=at_least_one, metavar="N",
                   help="GPUs per host (default: --world, at most 8): a --world past it spans hosts; with "
                        "--optimize, the ranks sharing one host's memory")
    p.add_argument("--intra-host", default="NVLink", choices=[k.name for k in LINKS if not k.between_hosts],
                   help="the link between the GPUs of one host when --world spans hosts (default NVLink)")
    p.add_argument("--batch", type=at_least_one, metavar="N",
                   help="rank the strategies at this local batch (per rank) instead of each one's largest")
    p.add_argument("--lower-bound", action="store_true",
                   help="on a card that is not here, price every op at the datasheet's rates (a lower bound on the "
                        "step) instead of the expected time at the rates a measured card's kernels reached")
    p.add_argument("--layer-sets", action="store_true",
                   help="also plan, for each count of layers no every_n_layers checkpoints, the best set of that "
                        "many layers (of the first k, k spread evenly and the last k: the lowest estimated peak)")
    p.add_argument("--sac", metavar="POLICY[,POLICY]",
                   help="also rank selective activation checkpointing under these policies (save-matmuls, "
                        "save-attention, save-nothing, or all) on every pattern that checkpoints, each planned "
                        "from its own few-layer FakeTensor simulation (a minute or more per policy)")
    p.add_argument("--html", metavar="FILE", help="also write the plan as a self-contained HTML page")
    p.add_argument("--json", action="store_true")
    p.add_argument("--verify", action="store_true",
                   help="run the recommendation and its neighbours here and print predicted vs measured step "
                        "time and peak (nothing is fitted to them: every point is held out)")
    p.add_argument("--out", help="with --verify: results directory (default results/plan-verify-<time>)")
    p.set_defaults(func=cmd_plan)
