"""Derive ckptbench/theory/memory/backward.py's MOMENTS table from the real layers, and say if it changed.

    python scripts/derive_backward_moments.py [--write] [--only PREFIX]

For every family × precision × attention × (kept | checkpointed) it runs the real transformers step on
fake tensors (no memory, seconds) for seven models with unrelated hidden / intermediate / head / kv
sizes and four (batch >= 2, seq) shapes, logs live activation and gradient bytes after every
allocation of the middle layer's backward (bf16-mixed: the forward and loss under
``torch.autocast("cpu", dtype=torch.bfloat16)`` over fp32 weights, as the manual loop runs it), and fits each allocation's value as an exact linear form in
N·h, N·i, N·kv, a·N·s, a·N, N, b·s², h·i, h², h·kv, h, kv, i (zero residual, or it stops).  The
allocation sequence is the same op for every shape, so allocation j is the same moment everywhere.
The moments kept are those that are the largest of the layer for some realistic shape (Llama-1B/8B,
GPT-2, Qwen2-0.5B dims, 16 to 16k tokens).  Needs a few minutes on two cores.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import pathlib
import sys

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ckptbench.measure.storage import LiveStorageTracker, track_training_state
from ckptbench.point.case import ModelSpec
from ckptbench.point.setup import PRECISIONS
from ckptbench.point.strategy import checkpointed_layers
from ckptbench.theory.memory import backward
from ckptbench.theory.memory.activations import head_activation_terms, layer_activation_terms
from ckptbench.theory.memory.simulate import _no_packed_sequence_detection, init_adamw_state
from ckptbench.train.checkpointing import decoder_layers, enable_checkpointing
from ckptbench.train.models import build_model

FEATURES = ["N*h", "N*i", "N*kv", "a*N*s", "a*N", "N", "b*s*s", "h*i", "h*h", "h*kv", "h", "kv", "i"]
MODELS = [(256, 8, 4, 688), (192, 6, 2, 520), (128, 8, 2, 344), (320, 10, 5, 600), (96, 6, 3, 400),
          (224, 4, 2, 296), (160, 10, 5, 480)]  # hidden, heads, kv_heads, intermediate
SHAPES = [(2, 64), (2, 96), (3, 40), (4, 48)]
REALISTIC = [(256, 8, 128, 688), (2048, 32, 512, 8192), (4096, 32, 1024, 14336), (64, 4, 32, 128),
             (896, 14, 128, 4864), (768, 12, 768, 3072), (5120, 40, 1024, 13824)]  # h, a, kv, i
LAYER = 1  # the middle layer of three


class Recorder(LiveStorageTracker):
    """Live activation and gradient bytes after each allocation while backward is inside LAYER."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.events: list[tuple[int, int]] = []
        self.start: tuple[int, int] | None = None

    def track(self, tensor, category):
        super().track(tensor, category)
        if self.inside:
            self.events.append((self.by_category["activations"], self.by_category["grads"]))


def record(spec: ModelSpec, batch: int, seq: int, checkpointed: bool, autocast: str = ""):
    with torch.device("meta"):
        model = build_model(spec, device="meta")
    enable_checkpointing(model, 1 if checkpointed else 0, offload=False)
    layers = decoder_layers(model)
    with FakeTensorMode(allow_non_fake_inputs=True), _no_packed_sequence_detection():
        model.to_empty(device="cpu")
        model.tie_weights()
        optimizer = torch.optim.AdamW(model.parameters())
        init_adamw_state(optimizer)
        ids = torch.randint(0, spec.vocab, (batch, seq))
        rec = Recorder()
        track_training_state(rec, model, optimizer)
        rec.track(ids, "activations")
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda p: rec.track(p.grad, "grads"))

        def enter(_grad):
            rec.inside = True
            rec.start = (rec.by_category["activations"], rec.by_category["grads"])

        def leave(_grad):
            rec.inside = False

        # tensor hooks, as the harness's layer probe uses: a module's full backward hooks would wrap its
        # outputs in extra autograd nodes and change what is allocated.  Backward enters LAYER when the
        # gradient of its output is complete and leaves it when the gradient of its input is.
        def on_output(_module, _args, output):
            if torch.is_grad_enabled():
                (output[0] if isinstance(output, tuple) else output).register_hook(enter)

        def on_input(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            if torch.is_grad_enabled() and hidden.requires_grad:
                hidden.register_hook(leave)

        layers[LAYER].register_forward_hook(on_output)
        layers[LAYER].register_forward_pre_hook(on_input, with_kwargs=True)
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with rec:
            with cast:
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
    return rec


def walk_start(spec: ModelSpec, batch: int, seq: int, checkpointed: bool, autocast: str = "") -> int:
    """Activations the estimate's walk says are alive when LAYER's backward starts (from the activation
    terms alone: the estimate's own walk needs the table being derived)."""
    ck = checkpointed_layers(spec.layers, 1 if checkpointed else 0)
    layer_full = sum(layer_activation_terms(spec, batch, seq, "cpu", autocast).values())
    ht = head_activation_terms(spec, batch, seq, bool(ck), len(ck) == spec.layers, "cpu", autocast)
    kept = spec.bytes_per_element * batch * seq * spec.hidden if checkpointed else layer_full
    a = spec.layers * kept + sum(ht.values())
    a -= ht["log_softmax"] + ht["labels"] + ht["final_norm"] + ht.get("lm_head_weight", 0)
    return a - (spec.layers - LAYER - 1) * kept  # the layers above LAYER have run their backward


def features(batch, seq, h, a, kv, i):
    n = batch * seq
    return [n * h, n * i, n * kv, a * n * seq, a * n, n, batch * seq * seq, h * i, h * h, h * kv, h, kv, i]


def derive(family: str, precision: str, attn: str, checkpointed: bool):
    rows, starts, events = [], [], []
    dtype, autocast = PRECISIONS[precision]
    for h, a, kvh, i in MODELS:
        kvh = a if family == "gpt2" else kvh
        spec = ModelSpec(family=family, dtype=dtype, attn=attn, vocab=256, max_positions=4096, hidden=h,
                         layers=3, heads=a, kv_heads=kvh, intermediate=i)
        for batch, seq in SHAPES:
            rec = record(spec, batch, seq, checkpointed, autocast)
            rows.append(features(batch, seq, h, a, kvh * (h // a), i))
            starts.append(rec.start[0] - walk_start(spec, batch, seq, checkpointed, autocast))
            events.append([(x - rec.start[0], g - rec.start[1]) for x, g in rec.events])
    x = np.array(rows, float)
    if family == "gpt2":  # kv == h there: one column says it
        for name in ("N*kv", "h*kv", "kv"):
            x[:, FEATURES.index(name)] = 0

    def solve(y):
        coef = np.round(np.linalg.lstsq(x, np.array(y, float), rcond=None)[0] * 4) / 4
        residual = float(np.max(np.abs(x @ coef - y)))
        if residual:
            sys.exit(f"{family}/{precision}/{attn}: no exact fit (residual {residual:.0f} B)")
        return coef

    if len({len(e) for e in events}) != 1:
        sys.exit(f"{family}/{precision}/{attn}: the allocation sequence depends on the shape")
    acts = [solve([e[j][0] for e in events]) for j in range(len(events[0]))]
    grads = [solve([e[j][1] for e in events]) for j in range(len(events[0]))]
    grid = np.array([features(b, s, h, a, kv if family != "gpt2" else h, i) for h, a, kv, i in REALISTIC
                     for b in (1, 2, 4, 8) for s in (16, 64, 256, 1024, 4096, 16384)], float)
    winners = sorted(set(np.argmax(np.array([grid @ (a + g) for a, g in zip(acts, grads)]), axis=0)))

    def form(coef):
        return {f: (int(c) if float(c).is_integer() else float(c)) for f, c in zip(FEATURES, coef) if c}

    return form(solve(starts)), tuple((form(acts[w]), form(grads[w])) for w in winners)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the table in backward.py")
    parser.add_argument("--only", default="", help="derive only the keys starting with this (others kept)")
    args = parser.parse_args()
    changed = 0
    table = dict(backward.MOMENTS)
    # pure precisions share one table for Llama and Qwen2 (Qwen2's biases are below a part in a thousand
    # there); under autocast the biases' bf16 copies are cached, so each family has its own exact table
    combos = [*itertools.product(("llama", "gpt2"), ("fp32", "bf16")), ("llama", "bf16-mixed"),
              ("qwen2", "bf16-mixed")]
    for (family, precision), attn, ckpt in itertools.product(combos, ("eager", "sdpa"), (False, True)):
        key = f"{family}/{precision}/{attn}/{'ckpt' if ckpt else 'kept'}"
        if not key.startswith(args.only):
            continue
        table[key] = derived = derive(family, precision, attn, ckpt)
        same = backward.MOMENTS.get(key) == derived
        changed += not same
        print(f"{key}: {'same' if same else 'CHANGED'}", flush=True)
        if not same:
            print(f"    was {backward.MOMENTS.get(key)!r}\n    now {derived!r}")
    path = pathlib.Path(backward.__file__)
    print(f"{changed} entries differ from {path.name}")
    if args.write and changed:
        text = path.read_text()
        head, rest = text.split("MOMENTS: dict", 1)
        tail = rest.split("\n}\n", 1)[1]
        body = "".join(f'    "{k}": (\n        {start!r},\n        (\n'
                       + "".join(f"            ({a!r}, {g!r}),\n" for a, g in moments) + "        ),\n    ),\n"
                       for k, (start, moments) in table.items())
        path.write_text(head + "MOMENTS: dict[str, tuple[Form, tuple[tuple[Form, Form], ...]]] = {\n" + body + "}\n"
                        + tail)
        print(f"rewrote {path}")
    return 1 if changed and not args.write else 0


if __name__ == "__main__":
    raise SystemExit(main())
