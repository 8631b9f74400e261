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


def grid_step(preset_name: str, layers: int, batch: int, seq: int, every_n: int):
    """(the model's spec, a function that runs one training step)."""
    import torch

    from ckptbench.spec import preset
    from ckptbench.train.checkpointing import enable_checkpointing
    from ckptbench.train.models import build_model, synthetic_batch

    torch.set_num_threads(1)
    spec = preset(preset_name, attn="sdpa", layers=layers, max_positions=max(2048, seq))
    model = build_model(spec)
    enable_checkpointing(model, every_n, False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = synthetic_batch(spec.vocab, batch, seq, 0)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return spec, step
