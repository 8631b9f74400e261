"""An Accelerate loop training LoRA adapters (peft) with checkpointing on, measured by ckptbench: the loop
is framed by ``with track(...) as t`` and each optimizer step by ``with t.step(batch)``.

    python examples/accelerate_lora.py --out results/accelerate-example
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

from ckptbench.track import track


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/accelerate-example")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)

    config = AutoConfig.for_model("llama", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                  max_position_embeddings=1024, tie_word_embeddings=False, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                                             task_type="CAUSAL_LM"))
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    rows = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    batch = rows.to(accelerator.device)

    model.train()
    with track(model, optimizer, out=args.out) as t:  # ckptbench: the added lines
        for _ in range(args.steps):
            with t.step(batch), accelerator.accumulate(model):  # ckptbench: t.step(batch)
                loss = model(input_ids=batch, labels=batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
    return t.record


if __name__ == "__main__":
    main()
