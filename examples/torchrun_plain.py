"""A plain PyTorch loop under ``torchrun`` (DDP), measured by ckptbench on every rank: one record per rank,
rank 0's in ``--out``, rank r's in ``--out/rank-<r>``.

    torchrun --nproc-per-node 2 examples/torchrun_plain.py --out results/torchrun-example
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoConfig, AutoModelForCausalLM

from ckptbench.track import track


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/torchrun-example")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--every-n-layers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)

    dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)  # the same initial weights on every rank
    config = AutoConfig.for_model("llama", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                  max_position_embeddings=1024, tie_word_embeddings=False, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(device)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False},
                                          every_n_layers=args.every_n_layers)
    model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(rank)  # each rank its own data
    batch = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=generator).to(device)

    with track(model, optimizer, out=args.out) as t:  # ckptbench: the added lines
        for _ in range(args.steps):
            with t.step(batch):  # ckptbench
                loss = model(input_ids=batch, labels=batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    dist.destroy_process_group()
    return t.record


if __name__ == "__main__":
    main()
