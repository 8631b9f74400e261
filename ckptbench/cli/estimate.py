"""``python -m ckptbench estimate``: the analytic memory answer, optionally beside a simulated step.

Registered by the main CLI through :func:`add_parser`; :func:`run` returns the process exit code.
Differences between the simulated and analytic columns are explained term by term in docs/estimate.md.
"""

from __future__ import annotations

import argparse
import json

from ..point.case import ATTENTIONS, PRESETS
from ..point.setup import precision_name
from ..point.strategy import SAC_POLICIES
from ..theory.memory import estimate as est_mod
from .quick import add_precision_flags, precision_flag, train_lines

GIB = 1024**3


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("estimate", help="predicted memory of one training step (no GPU needed)")
    p.add_argument("--model", required=True, choices=sorted(PRESETS), help="model preset name")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--every-n-layers", type=int, default=0, help="0 = off, 1 = every layer, n = every n-th")
    p.add_argument("--layers", default="", metavar="I,J,...",
                   help="checkpoint exactly these layers (0-based, increasing) instead of --every-n-layers")
    p.add_argument("--sac", default="", metavar="POLICY",
                   help=f"selective activation checkpointing inside the checkpointed layers: {', '.join(SAC_POLICIES)} "
                        "(estimated by the simulated step)")
    p.add_argument("--offload", action="store_true", help="checkpointed inputs go to host memory")
    p.add_argument("--offload-streamed", action="store_true",
                   help="streamed offload: on a side stream, the layer below prefetched in backward (implies --offload)")
    add_precision_flags(p)
    p.add_argument("--attn", choices=ATTENTIONS, default=None,
                   help="default: what transformers builds without being told (sdpa where the model has it; "
                        "eager in fp32 on CUDA)")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda",
                   help="device whose kernels/optimizer are modelled (default cuda)")
    p.add_argument("--world", type=int, default=2, metavar="N", help="with --sharding fsdp: the ranks (default 2)")
    p.add_argument("--sharding", choices=("ddp", "fsdp"), default="ddp",
                   help="fsdp: one FSDP2 rank's memory and the step's all-gathers and reduce-scatters")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--simulate", action="store_true",
                   help="also run one real step on fake CPU tensors and show it beside the estimate")
    p.set_defaults(func=run)
    return p


def _gib(n: int | float) -> str:
    return f"{n / GIB:10.3f}"


def _rows(e: est_mod.Estimate) -> list[tuple[str, int]]:
    rows = [
        ("params", e.params_bytes),
        ("grads (at peak: " + e.peak_phase + ")", e.peak_breakdown["grads"]),
        ("optimizer state", e.optimizer_bytes),
        ("activations after forward (device)", e.activations_after_forward_bytes),
    ]
    rows += [(f"  layer term: {k} (per layer)", v) for k, v in e.layer_terms.items()]
    rows += [(f"  head term: {k}", v) for k, v in e.head_terms.items()]
    rows += [
        (f"  checkpointed inputs ({len(e.checkpointed_layers)} layers)", e.checkpointed_input_bytes),
        ("host (offloaded checkpointed inputs)", e.host_bytes),
        ("after forward total (device)", e.mem_after_forward_bytes),
        ("peak (device)", e.peak_bytes),
    ]
    return rows


def render_table(e: est_mod.Estimate, sim: dict | None = None) -> str:
    precision = precision_name(e.dtype, e.autocast)
    which = (f"every_n_layers={e.every_n_layers}" if e.every_n_layers or not e.checkpointed_layers else
             f"layers={','.join(map(str, e.checkpointed_layers))}")
    head = (f"{e.model}  {precision} {e.attn}  b={e.batch} s={e.seq}  {which}"
            f"{' offload' if e.offload else ''}{'-' + e.offload_kind if e.offload_kind else ''}  params={e.n_params:,}")
    lines = [head, ""]
    if sim is None:
        lines.append(f"{'quantity':52s} {'GiB':>10s} {'bytes':>16s}")
        for name, v in _rows(e):
            lines.append(f"{name:52s} {_gib(v)} {v:16,d}")
    else:
        lines.append(f"{'quantity':40s} {'analytic GiB':>12s} {'simulated GiB':>14s} {'sim - analytic':>16s}")
        pairs = [
            ("params", e.params_bytes, sim["params_bytes"]),
            ("optimizer", e.optimizer_bytes, sim["optimizer_bytes"]),
            ("activations after forward", e.activations_after_forward_bytes,
             sim["activations_after_forward_bytes"]),
            ("checkpointed inputs", e.checkpointed_input_bytes, sim["checkpointed_input_bytes"]),
            ("offloaded (host)", e.offloaded_bytes, sim["offloaded_bytes"]),
            ("after forward total", e.mem_after_forward_bytes, sim["mem_after_forward_bytes"]),
            ("peak", e.peak_bytes, sim["peak_bytes"]),
        ] + [(f"  peak: {k}", e.peak_breakdown[k], sim["peak_breakdown"][k]) for k in e.peak_breakdown]
        for name, a, s in pairs:
            lines.append(f"{name:40s} {a / GIB:12.3f} {s / GIB:14.3f} {s - a:16,d}")
        lines += ["", f"simulated step took {sim['wall_s']:.1f} s (fake tensors on CPU)",
                  "why they differ: after-forward terms are exact on CPU kernels; the peak differs by the",
                  "gradient temporaries inside one layer's backward, which the analytic walk approximates",
                  "(see docs/estimate.md).  The simulation runs CPU kernels, with the optimizer torch",
                  "would pick on the device (AdamW's foreach kernels for --device cuda)."]
    return "\n".join(lines)


FLAGS = {"sweep.batch_size": "--batch", "sweep.seq_len": "--seq", "sweep.every_n_layers": "--every-n-layers",
         "sweep.offload": "--offload", "sweep.grad_accum": "--grad-accum", "sweep.checkpoint_layers": "--layers",
         "sweep.sac": "--sac"}


def case_from_args(args: argparse.Namespace):
    """The point the flags describe, validated by the same rules as a suite file (one source of truth)."""
    from ..base.errors import UsageError
    from ..suite.keys import SuiteError
    from ..suite.parse import parse_suite

    model = [f'preset = "{args.model}"'] + [f'{k} = "{v}"' for k, v in (
        ("dtype", args.dtype), ("precision", precision_flag(args)), ("attn", args.attn)) if v]
    text = "\n".join([
        f'[suite]\ndevice = "{getattr(args, "device", "cuda")}"', "[model]", *model,
        "[train]", *train_lines(args), "[sweep]",
        f"batch_size = [{args.batch}]", f"seq_len = [{args.seq}]", *_strategy_lines(args),
        f"offload = [{_offload_value(args)}]", f"grad_accum = [{getattr(args, 'grad_accum', 1)}]",
    ])
    try:
        return parse_suite(text, "estimate").cases[0]
    except SuiteError as exc:
        raise UsageError(f"{FLAGS.get(exc.key, exc.key)}: {exc.reason}") from None


def _offload_value(args: argparse.Namespace) -> str:
    """``--offload`` / ``--offload-streamed`` as the suite's ``offload`` value."""
    if getattr(args, "offload_streamed", False):
        return '"streamed"'
    return "true" if args.offload else "false"


def _strategy_lines(args: argparse.Namespace) -> list[str]:
    """``--every-n-layers`` or ``--layers``, and ``--sac``, as the suite keys that check them."""
    from ..base.errors import UsageError

    layers, sac = getattr(args, "layers", ""), getattr(args, "sac", "")
    if layers and args.every_n_layers:
        raise UsageError("--layers: give a layer set or --every-n-layers, not both")
    try:
        which = (f"checkpoint_layers = [[{', '.join(str(int(i)) for i in layers.split(','))}]]" if layers else
                 f"every_n_layers = [{args.every_n_layers}]")
    except ValueError:
        raise UsageError(f"--layers: layer indices separated by commas (0,1,2,5), got {layers!r}") from None
    return [which] + ([f"sac = [{json.dumps(sac)}]"] if sac else [])


def _simulated_only(case) -> int:
    """A model without an analytic estimate: the simulated step is its answer."""
    from ..theory.memory.simulate import simulate

    sim = simulate(case.model, case.batch_size, case.seq_len, case.every_n_layers, case.offload,
                   device=case.device, setup=case.setup, recompute=case.recompute,
                   grad_accum=case.grad_accum).to_dict()
    from ..point.case import not_analytic_because

    spec = case.model
    why = (not_analytic_because(spec, case.setup, case.device)
           or f"the analytic estimate does not model what SAC policy {case.recompute.sac} keeps")
    print(f"{spec.label} {case.precision} {spec.attn} b={case.batch_size} s={case.seq_len} {case.strategy} "
          f"on {case.device}: {why}, so the simulated step (the real step on fake tensors) is the estimate")
    for key in ("params_bytes", "optimizer_bytes", "mem_after_forward_bytes", "peak_bytes",
                "checkpointed_input_bytes", "offloaded_bytes"):
        print(f"{key:40s} {_gib(sim[key]):>12s} GiB")
    print(f"{'peak_phase':40s} {sim['peak_phase']:>12s}")
    return 0


def _sharded(case, world: int) -> int:
    """One FSDP2 rank's memory and the collectives of a step, per rank (shards are padded to N rows)."""
    from dataclasses import replace

    from ..point.case import analytic_sharded_point
    from ..theory.comm.fsdp import fsdp_comm_estimate, fsdp_memory_estimate

    case = replace(case, world_size=world, setup=replace(case.setup, sharding="fsdp"))
    if not analytic_sharded_point(case.model, case.setup, case.device):
        from ..base.errors import UsageError

        raise UsageError("--sharding fsdp is estimated for llama, qwen2 and gpt2 shapes in a pure precision or "
                         "bf16-mixed, under the manual loop, with AdamW")
    comm = fsdp_comm_estimate(case.model, world, case.grad_accum, autocast=case.setup.autocast)
    print(f"{case.model.label} {case.precision} {case.model.attn} b={case.batch_size} s={case.seq_len} per rank "
          f"{case.strategy} on {case.device}")
    print(f"{'rank':>4s} {'params GiB':>11s} {'optimizer GiB':>14s} {'peak GiB':>9s}  peak phase")
    for rank in range(world):
        m = fsdp_memory_estimate(case, rank)
        print(f"{rank:4d} {_gib(m['params_bytes'])} {_gib(m['optimizer_bytes']):>14s} {_gib(m['peak_bytes'])}  "
              f"{m['peak_phase']}")
    print(f"per optimizer step: {comm['allgather_count']} all-gathers of {comm['allgather_payload_bytes']:,} B, "
          f"{comm['reduce_scatter_count']} reduce-scatters of {comm['reduce_scatter_payload_bytes']:,} B per rank")
    return 0


def run(args: argparse.Namespace) -> int:
    case = case_from_args(args)
    if args.sharding == "fsdp":
        return _sharded(case, args.world)
    if not case.analytic:
        return _simulated_only(case)
    e = est_mod.estimate_case(case)
    sim = None
    if args.simulate:
        from ..theory.memory.simulate import simulate

        sim = simulate(case.model, case.batch_size, case.seq_len, case.every_n_layers, case.offload,
                       device=case.device, setup=case.setup, recompute=case.recompute,
                       grad_accum=case.grad_accum).to_dict()
    if args.json:
        print(json.dumps({"estimate": e.to_dict(), "simulated": sim}, indent=2))
    else:
        print(render_table(e, sim))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ckptbench")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
