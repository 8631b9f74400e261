"""Checkpointing policy for qwen2-tiny (qwen2, 4 layers, fp32 sdpa) at seq 512, batch 1, within 0.01 GiB on cpu.

Found by `ckptbench plan --optimize`: 11,036 tokens/s and a peak of 0.012 GiB predicted (analytic estimate).
Apply it to a transformers model once, before training (leave TrainingArguments' activation_checkpointing off):

    from policy import apply
    apply(model)
"""

import functools

CHECKPOINTED_LAYERS = ()  # decoder layers whose activations are recomputed in backward
OFFLOAD = False  # transformers' offload: each checkpointed layer's input kept in pinned host memory
SAC_KEEP = ()  # selective checkpointing: operators whose outputs a checkpointed layer keeps
BATCH_SIZE = 1  # the batch (per device) the policy was found for


def apply(model):
    """Checkpoint exactly CHECKPOINTED_LAYERS of `model` through transformers' own call, non-reentrant."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    kwargs = {"use_reentrant": False}
    if SAC_KEEP:
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        def policy(ctx, op, *args, **kw):
            name = str(getattr(op, "overloadpacket", op))
            return CheckpointPolicy.MUST_SAVE if name in SAC_KEEP else CheckpointPolicy.PREFER_RECOMPUTE

        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policy)
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs, every_n_layers=1, offload=OFFLOAD)
    else:  # transformers 5.17 and earlier
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs, every_n_layers=1, offload=OFFLOAD)
    blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for i, block in enumerate(blocks):
        block.gradient_checkpointing = i in CHECKPOINTED_LAYERS
    return model
