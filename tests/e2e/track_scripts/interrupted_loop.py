"""A plain tracked loop, slow enough to be signalled while it is measured: prints MEASURING once the
memory step is behind it; with --own-handler it installs its own SIGTERM handler first (stop at the next
step, as a training script that checkpoints on preemption does); with --untracked the same loop runs
without the tracker (how the run ends on its own, which the tracked run must match)."""

from __future__ import annotations

import argparse
import signal
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ckptbench.point.training import Timing, TrainSpec
from ckptbench.track import track


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--own-handler", action="store_true")
    p.add_argument("--untracked", action="store_true")
    args = p.parse_args()
    stop = []
    if args.own_handler:
        signal.signal(signal.SIGTERM, lambda signum, frame: (print("USER HANDLER", flush=True), stop.append(1)))
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, intermediate_size=64, vocab_size=128,
                                  max_position_embeddings=64, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    train = TrainSpec(warmup_steps=1, steps=3, timing=Timing(max_steps=500, max_time_s=600.0, precision=1e-9))
    if args.untracked:
        for k in range(1000):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            time.sleep(0.02)
            if k == 4:
                print("MEASURING", flush=True)
        return 0
    with track(model, optimizer, out=args.out, train=train) as t:
        for k in range(1000):
            if stop:
                print(f"STOPPED at {k}", flush=True)
                break
            with t.step(ids):
                model(input_ids=ids, labels=ids).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                time.sleep(0.02)
            if t.session.k == 4:
                print("MEASURING", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
