"""What tracking costs a user's timed steps: ``ckptbench.track`` against the same plain loop untracked.

    python scripts/track_overhead.py [--rounds 6] [--steps 15] [--preset llama-small] [--seq 512]

One process, one model (a Llama from a preset, every-2 checkpointing through transformers' own API, AdamW,
one torch thread), in interleaved rounds of two blocks each, the block order alternating:

- untracked: ``--steps`` steps of the plain loop, each timed by ``time.perf_counter`` around it;
- tracked: the same loop framed by ``with track(...)`` / ``with t.step(batch)``: one warm-up step, the
  memory step (the exact tracker: never timed) and ``--steps`` timed steps, as the record states them (the
  worker's timer around the same step, every hook on the path: the forward pre/post hooks, the optimizer
  hooks, each decoder layer's forward timed in place).

First, adjacent pairs: in a tracked run each timed step is followed by the same step unframed (the hooks
installed but idle), and each pair's thread-CPU ratio is taken: the machine's drift cancels within a pair.
Then blocks: each round gives the ratio of the tracked block's median step to the untracked block's, in the stepping
thread's CPU time (the step's own cost with one torch thread, which other processes on a shared machine
move little) and in wall time; the answer is the median ratio over the rounds, with the rounds' range.  After its record is written a tracker removes
its hooks: the steps after it run the untracked loop.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from ckptbench.point.case import preset
from ckptbench.point.training import Timing, TrainSpec
from ckptbench.track import track
from ckptbench.train.models import build_model, synthetic_batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--preset", default="llama-small")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(preset(args.preset))
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = synthetic_batch(model.config.vocab_size, args.batch, args.seq, 0)

    def step():
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    def untracked() -> tuple[float, float]:
        walls, cpus = [], []
        for _ in range(args.steps):
            t0, c0 = time.perf_counter(), time.thread_time()
            step()
            cpus.append(time.thread_time() - c0)
            walls.append(time.perf_counter() - t0)
        return statistics.median(walls), statistics.median(cpus)

    train = TrainSpec(warmup_steps=1, steps=args.steps,
                      timing=Timing(precision=0.0, max_steps=args.steps, max_time_s=1e9))

    def tracked() -> tuple[float, float]:
        with tempfile.TemporaryDirectory() as out, track(model, optimizer, out=out, train=train, echo=False) as t:
            while t.record is None:
                with t.step(batch):
                    step()
            m = t.record["measurement"]
            return m["step_time_median_s"], statistics.median(m["step_cpu_times_s"])

    def paired() -> tuple[list[float], list[float]]:
        """One tracked run whose every timed step is followed by an untracked one (the hooks installed but
        idle: their cost is one Python call each); (tracked, untracked) thread-CPU seconds, pair by pair."""
        plain: list[float] = []
        with tempfile.TemporaryDirectory() as out, track(model, optimizer, out=out, train=train, echo=False) as t:
            while t.record is None:
                timed = t.session.schedule is not None and t.session.schedule.kind(t.session.k) == "timed"
                with t.step(batch):
                    step()
                if timed:
                    c0 = time.thread_time()
                    step()
                    plain.append(time.thread_time() - c0)
            return t.record["measurement"]["step_cpu_times_s"], plain

    for _ in range(3):
        step()
    pairs: list[float] = []
    for _ in range(args.rounds):
        tracked_cpu, plain_cpu = paired()
        pairs += [a / b for a, b in zip(tracked_cpu, plain_cpu)]
    print(f"{args.preset} seq {args.seq} batch {args.batch}, every-2, 1 thread: tracked / untracked step, thread CPU, "
          f"adjacent pairs: median {statistics.median(pairs):.4f} (quartiles "
          f"{statistics.quantiles(pairs, n=4)[0]:.4f} to {statistics.quantiles(pairs, n=4)[2]:.4f}, {len(pairs)} pairs)",
          flush=True)
    walls, cpus = [], []
    for r in range(args.rounds):
        if r % 2 == 0:
            plain, measured = untracked(), tracked()
        else:
            measured, plain = tracked(), untracked()
        walls.append(measured[0] / plain[0])
        cpus.append(measured[1] / plain[1])
        print(f"round {r + 1}: wall untracked {plain[0] * 1e3:.2f} ms, tracked {measured[0] * 1e3:.2f} ms "
              f"({walls[-1]:.4f}); thread CPU untracked {plain[1] * 1e3:.2f} ms, tracked {measured[1] * 1e3:.2f} ms "
              f"({cpus[-1]:.4f})", flush=True)
    for what, ratios in (("thread CPU", cpus), ("wall", walls)):
        print(f"{args.preset} seq {args.seq} batch {args.batch}, every-2, 1 thread: tracked / untracked median "
              f"step, {what}: {statistics.median(ratios):.4f} (rounds {min(ratios):.4f} to {max(ratios):.4f}, "
              f"{args.rounds} rounds of {args.steps} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
