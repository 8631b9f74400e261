"""The step-time grid's training step, built for the scripts that look inside it (op_prices.py,
heap_trim_replay.py, matmul_cold.py): a preset at a depth, the manual loop, AdamW, sdpa, checkpointing through
transformers' API; one thread."""

from __future__ import annotations


def add_step_arguments(parser) -> None:
    """PRESET LAYERS BATCH SEQ EVERY_N, the step's positional arguments."""
    parser.add_argument("preset")
    parser.add_argument("layers", type=int)
    parser.add_argument("batch", type=int)
    parser.add_argument("seq", type=int)
    parser.add_argument("every_n", type=int)


def grid_spec(preset_name: str, layers: int, seq: int):
    """The grid's model: the preset at `layers`, sdpa, positions for `seq` tokens (2,048 at least)."""
    from ckptbench.spec import preset

    return preset(preset_name, attn="sdpa", layers=layers, max_positions=max(2048, seq))


def grid_case(preset_name: str, layers: int, batch: int, seq: int, every_n: int, offload: bool = False):
    """The grid's Case for a point (as the sweep's worker would trace and price it)."""
    from ckptbench.spec import Case, TrainSpec

    return Case(model=grid_spec(preset_name, layers, seq), train=TrainSpec(threads=1), batch_size=batch,
                seq_len=seq, every_n_layers=every_n, offload=offload)


def grid_step(preset_name: str, layers: int, batch: int, seq: int, every_n: int):
    """(the model's spec, a function that runs one training step)."""
    import torch

    from ckptbench.train.checkpointing import enable_checkpointing
    from ckptbench.train.models import build_model, synthetic_batch

    torch.set_num_threads(1)
    spec = grid_spec(preset_name, layers, seq)
    model = build_model(spec)
    enable_checkpointing(model, every_n, False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = synthetic_batch(spec.vocab, batch, seq, 0)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return spec, step


def self_seconds(step, steps: int = 2) -> dict:
    """Each op's self CPU seconds a step, the step run `steps` times under ``torch.profiler``."""
    import collections

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    inside: collections.Counter = collections.Counter()
    for ev in prof.key_averages():
        inside[ev.key] += ev.self_cpu_time_total / 1e6 / steps
    return inside
