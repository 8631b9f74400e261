"""``ckptbench sweep --model NAME ...``: a sweep without writing a suite file first.

The flags become a suite's TOML text (kept as ``suite.toml`` in the results directory, like any suite's),
so a quick sweep is exactly as reproducible as a written one: ``--suite OUT/suite.toml`` runs it again.
"""

from __future__ import annotations

import argparse
import json
import os
import re

from ..base.errors import UsageError
from ..point.case import PRESETS
from ..point.setup import LOOPS, OPTIMIZERS, PRECISIONS

# What a command that names no precision runs: what Trainer(bf16=True) / Accelerator(mixed_precision="bf16")
# run, fp32 master weights with bf16 autocast; a suite file that names none keeps fp32, as before.
DEFAULT_PRECISION = "bf16-mixed"


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None


def model_source(model: str) -> str:
    """A preset name, a config.json (file or directory), or a hub name: the suite line that says which."""
    # json.dumps quotes a TOML basic string: a quote or newline in the flag stays inside the value
    if model in PRESETS:
        return f"preset = {json.dumps(model)}"
    if os.path.exists(model):
        return f"config = {json.dumps(os.path.abspath(model))}"
    if "/" in model:
        return f"hub = {json.dumps(model)}"
    raise UsageError(f"--model {model!r} is not a preset ({', '.join(sorted(PRESETS))}), a config.json path "
                     "or a hub name (org/name)")


def model_flag(model: str) -> str:
    """How a message names the --model value: as given, quoted when it holds a newline or control character."""
    return f"--model {model if model.isprintable() else repr(model)}"


def model_lines(model: str, **overrides) -> list[str]:
    """A suite's [model] lines: the source, then each override given (sizes as numbers, the rest quoted)."""
    lines = [model_source(model)]
    for key, value in overrides.items():
        if value is not None:
            lines.append(f"{key} = {value}" if isinstance(value, int) else f'{key} = "{value}"')
    return lines


def precision_flag(args) -> str | None:
    """--precision, or the default when neither it nor its pure alias --dtype is given: bf16-mixed, or with
    --lora the base loaded in bf16 (``torch_dtype=torch.bfloat16``, as the PEFT guides load it; peft keeps
    the adapters in fp32 and casts their input to it)."""
    if getattr(args, "precision", None):
        return args.precision
    if getattr(args, "dtype", None):
        return None
    return "bf16" if getattr(args, "lora", None) else DEFAULT_PRECISION


def add_precision_flags(p) -> None:
    p.add_argument("--precision", choices=tuple(PRECISIONS),
                   help=f"default {DEFAULT_PRECISION}: fp32 master weights, bf16 autocast, as Trainer(bf16=True)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), help="a pure precision (alias of --precision)")
    p.add_argument("--loop", choices=LOOPS, default="manual",
                   help="the training loop: manual (default), trainer (transformers.Trainer), accelerate")
    p.add_argument("--lora", type=_rank, metavar="R",
                   help="LoRA adapters of rank R through peft on a frozen base (default: full fine-tuning); "
                        "without --precision the base is loaded in bf16")
    p.add_argument("--lora-targets", type=_targets, metavar="M,M,...",
                   help="with --lora: the modules to adapt (default: peft's choice for the model type)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw",
                   help="adamw (default: torch's AdamW), adamw-foreach, adamw-loop, sgd (momentum 0.9), "
                        "adafactor (transformers'), adamw-8bit (bitsandbytes), adamw-fused (AdamW(fused=True))")


def _rank(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a LoRA rank is a whole number >= 1, got {text!r}")
    return int(text)


def _targets(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", t)]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected module names such as q_proj,v_proj, got {text!r}")
    return names


def train_lines(args) -> list[str]:
    """The [train] lines of the setup flags (--loop, --lora, --lora-targets, --optimizer)."""
    lines = [f'loop = "{getattr(args, "loop", "manual")}"', f'optimizer = "{getattr(args, "optimizer", "adamw")}"']
    if getattr(args, "lora_targets", None) and not getattr(args, "lora", None):
        raise UsageError("--lora-targets: give the adapters' rank with --lora R")
    if getattr(args, "lora", None):
        targets = f", targets = {json.dumps(args.lora_targets)}" if args.lora_targets else ""
        lines.append(f"lora = {{ r = {args.lora}{targets} }}")
    return lines


def run_name(model: str) -> str:
    """``<model>-quick``: the model's file, directory or hub name made a plain directory name (the suite
    name rule: letters, digits, ``.``, ``_``, ``-``, not starting with ``.``, at most 100 characters)."""
    base = os.path.basename(os.path.abspath(model) if os.path.exists(model) else model.rstrip("/"))
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", base).strip("._")[:94]
    return f"{base or 'model'}-quick"


# What a quick sweep compares when it names no checkpointing: none, every other layer and every layer (and
# each with offload on CUDA, where offload moves something; on a CPU the host is the device)
DEFAULT_EVERY_N = [0, 2, 1]


def suite_text(args, every_n_default: list[int] = DEFAULT_EVERY_N) -> str:
    """The suite the quick flags describe."""
    name = run_name(args.model)
    model = model_lines(args.model, layers=args.layers, hidden=args.hidden, vocab=args.vocab, dtype=args.dtype,
                        attn=args.attn, precision=precision_flag(args))
    every_n = args.every_n_layers or every_n_default
    sweep = [f"batch_size = {args.batch or [1]}", f"seq_len = {args.seq or [512]}", f"every_n_layers = {every_n}"]
    if args.offload or (args.device == "cuda" and not args.every_n_layers):
        sweep.append("offload = [false, true]")
    device = f'device = "{args.device}"\n' if args.device else ""
    timing = [f"max_steps = {args.max_steps}"] if getattr(args, "max_steps", None) else []
    train = "\n[train]\n" + "\n".join(train_lines(args) + timing) + "\n"
    return (f'# written by: ckptbench sweep --model {args.model} (quick form)\n[suite]\nname = "{name}"\n'
            f"{device}\n[model]\n" + "\n".join(model) + "\n" + train + "\n[sweep]\n" + "\n".join(sweep) + "\n")


def add_arguments(p) -> None:
    g = p.add_argument_group("quick form (instead of --suite)")
    g.add_argument("--model", help="a preset, a config.json (or its directory), or a hub name org/name")
    g.add_argument("--layers", type=int, help="override the model's layer count (shrink it to fit)")
    g.add_argument("--hidden", type=int, help="override the hidden size")
    g.add_argument("--vocab", type=int, help="override the vocabulary size")
    g.add_argument("--seq", type=_ints, metavar="S,S,...", help="sequence lengths (default 512)")
    g.add_argument("--batch", type=_ints, metavar="B,B,...", help="batch sizes (default 1)")
    g.add_argument("--every-n-layers", type=_ints, metavar="N,N,...",
                   help="checkpointing settings (default 0,2,1: none, every other layer, every layer)")
    g.add_argument("--offload", action="store_true",
                   help="also every checkpointed setting with offload (the default on --device cuda)")
    add_precision_flags(g)
    g.add_argument("--attn", choices=("eager", "sdpa"),
                   help="default: transformers' default for the model (sdpa where it has it; eager in fp32 on CUDA)")
    g.add_argument("--device", choices=("cpu", "cuda"))
    g.add_argument("--max-steps", type=int, metavar="N",
                   help="time at most N steps a point (default 50: steps are timed until their median is known "
                        "to ±2 %%, 20 s or 50 steps)")
