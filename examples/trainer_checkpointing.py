"""A transformers Trainer run with checkpointing on every n-th layer and bf16 mixed precision where the
machine supports it, measured by ckptbench with one added line (``trainer.add_callback(...)``).

    python examples/trainer_checkpointing.py --out results/trainer-example

The model is a small Llama built from its config (random weights, nothing downloaded); put your own model,
data and arguments in its place: the added line stays the same.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

from ckptbench.track import TrainerTracker


class TokenRows(torch.utils.data.Dataset):
    """Rows of token ids, as a tokenised and grouped causal-LM dataset gives them."""

    def __init__(self, vocab: int, rows: int, seq: int, seed: int = 0):
        self.rows = torch.randint(0, vocab, (rows, seq), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def bf16_supported() -> bool:
    return torch.cuda.is_bf16_supported() if torch.cuda.is_available() else True  # CPU autocast runs bf16


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/trainer-example")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--every-n-layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)

    config = AutoConfig.for_model("llama", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                  max_position_embeddings=1024, tie_word_embeddings=False, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="trainer-example-"), max_steps=args.steps,
        per_device_train_batch_size=args.batch, learning_rate=1e-4, lr_scheduler_type="constant",
        optim="adamw_torch", bf16=bf16_supported(), use_cpu=not torch.cuda.is_available(),
        activation_checkpointing=True,
        activation_checkpointing_kwargs={"use_reentrant": False, "every_n_layers": args.every_n_layers},
        eval_strategy="no", save_strategy="no", logging_steps=50, report_to="none", disable_tqdm=True,
        dataloader_pin_memory=False)
    trainer = Trainer(model=model, args=training_args,
                      train_dataset=TokenRows(config.vocab_size, args.steps * args.batch, args.seq))
    tracker = TrainerTracker(out=args.out)  # ckptbench: the one added line (with the next)
    trainer.add_callback(tracker)
    trainer.train()
    return tracker.record


if __name__ == "__main__":
    main()
