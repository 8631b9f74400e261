"""A causal-LM training script in the shape of transformers' examples/pytorch/language-modeling/run_clm.py
(model from a config, text grouped into blocks, ``Trainer`` with ``TrainingArguments`` from the command
line), held out from ckptbench's examples: the tracking is its one added line (``trainer.add_callback``).

Offline: the model is built from ``model_type`` with ``config_overrides``; the text is the Python standard
library's ``this.py`` read as bytes (one token per byte, vocabulary 256).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

from ckptbench.track import TrainerTracker


@dataclass
class ModelArguments:
    model_type: str = field(default="llama")
    config_overrides: str = field(default="hidden_size=64,num_hidden_layers=4,num_attention_heads=4,"
                                  "num_key_value_heads=2,intermediate_size=128,vocab_size=256")


@dataclass
class DataTrainingArguments:
    block_size: int = field(default=64)
    ckptbench_out: str = field(default="results/run_clm")


def byte_dataset(block_size: int) -> list[dict]:
    """The text as bytes, concatenated and cut into blocks of `block_size` (run_clm's ``group_texts``)."""
    path = importlib.util.find_spec("this").origin  # the Zen of Python's source, not imported (it prints)
    with open(path, "rb") as fh:
        ids = list(fh.read() * 8)
    total = (len(ids) // block_size) * block_size
    blocks = [ids[i:i + block_size] for i in range(0, total, block_size)]
    return [{"input_ids": torch.tensor(b), "labels": torch.tensor(b)} for b in blocks]


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    argv = sys.argv[1:] + ["--activation_checkpointing", "--activation_checkpointing_kwargs", '{"use_reentrant": false}',
                           "--per_device_train_batch_size", "2", "--report_to", "none", "--save_strategy", "no",
                           "--use_cpu", str(not torch.cuda.is_available()), "--disable_tqdm", "True"]
    model_args, data_args, training_args = parser.parse_args_into_dataclasses(argv)
    set_seed(training_args.seed)

    config = AutoConfig.for_model(model_args.model_type)
    config.update_from_string(model_args.config_overrides)
    model = AutoModelForCausalLM.from_config(config)
    train_dataset = byte_dataset(data_args.block_size)

    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset,
                      data_collator=default_data_collator)
    trainer.add_callback(TrainerTracker(out=data_args.ckptbench_out))  # the one added line
    train_result = trainer.train()
    trainer.log_metrics("train", train_result.metrics)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
