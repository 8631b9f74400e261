"""A training script in the shape of accelerate's examples/by_feature/gradient_accumulation.py and
local_sgd.py (an ``Accelerator`` with ``gradient_accumulation_steps``, a DataLoader, a scheduler,
``with accelerator.accumulate(model):`` around each micro-batch, ``LocalSGD`` around each epoch, and
``local_sgd.step()`` after each micro-batch), held out from ckptbench's examples: a causal LM in place of the
examples' classifier (ckptbench measures causal LMs), random tokens in place of GLUE (offline).

The tracking is what docs/track.md says to add: ``with track(model, optimizer, out=...) as t:`` around the
epochs and ``t.step(batch)`` as the first line of each micro-batch.

    python tests/e2e/track_scripts/accelerate_by_feature.py --gradient_accumulation_steps 2 --out DIR
    torchrun --nproc-per-node 2 tests/e2e/track_scripts/accelerate_by_feature.py --local_sgd_steps 4 --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from accelerate import Accelerator
from accelerate.local_sgd import LocalSGD
from accelerate.utils import set_seed
from transformers import AutoConfig, AutoModelForCausalLM, get_linear_schedule_with_warmup

from ckptbench.track import track


def training_function(args) -> tuple[dict | None, list[float], torch.Tensor]:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
    set_seed(0)
    config = AutoConfig.for_model("llama", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                  max_position_embeddings=1024, tie_word_embeddings=False, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    rows = torch.randint(0, config.vocab_size, (args.rows, args.seq), generator=torch.Generator().manual_seed(1))
    dataset = [{"input_ids": r, "labels": r} for r in rows]
    train_dataloader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=1000)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader,
                                                                           lr_scheduler)
    losses = []
    tracking = track(model, optimizer, out=args.out, echo=False) if args.out else _Untracked()
    with tracking as t:  # ckptbench: the added line
        for _epoch in range(args.epochs):
            model.train()
            with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=args.local_sgd_steps or 1,
                          enabled=args.local_sgd_steps is not None) as local_sgd:
                for batch in train_dataloader:
                    if t is not None:
                        t.step(batch)  # ckptbench: the added line
                    with accelerator.accumulate(model):
                        output = model(**batch)
                        loss = output.loss
                        accelerator.backward(loss)
                        optimizer.step()
                        lr_scheduler.step()
                        optimizer.zero_grad()
                        local_sgd.step()
                    losses.append(loss.item())
    params = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
    return (t.record if t is not None else None), losses, params


class _Untracked:
    """The same script without ckptbench, for the comparison of its training with the tracked one's."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--local_sgd_steps", type=int, default=None)
    parser.add_argument("--out", default="")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--losses", default="", help="write the losses and a parameter checksum here (JSON)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None):
    args = arguments(argv)
    torch.set_num_threads(1)
    record, losses, params = training_function(args)
    if args.losses:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        with open(f"{args.losses}.{rank}", "w", encoding="utf-8") as fh:
            json.dump({"losses": losses, "params": params.double().sum().item()}, fh)
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
