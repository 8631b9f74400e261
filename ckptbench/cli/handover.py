"""What ``plan --optimize`` hands over: the optimum as something that runs.

(a) ``TrainingArguments`` keywords, where transformers can say the policy (every n-th layer, with or without
its offload, no SAC policy); (b) ``policy.py``, a small file with the policy and ``apply(model)``, which
any loop calls once on its model (the two lines: ``from policy import apply`` and ``apply(model)``); (c) a
suite file ``sweep`` runs to measure it.  The file needs transformers and torch only, not ckptbench.
"""

from __future__ import annotations

import json

from ..point.strategy import SAC_POLICIES, checkpointed_layers, layer_set_name

POLICY_FILE = '''"""{title}

Found by `ckptbench plan --optimize`: {why}.
Apply it to a transformers model once, before training (leave TrainingArguments' activation_checkpointing off):

    from policy import apply
    apply(model)
"""

import functools

CHECKPOINTED_LAYERS = {layers!r}  # decoder layers whose activations are recomputed in backward
OFFLOAD = {offload!r}  # transformers' offload: each checkpointed layer's input kept in pinned host memory
SAC_KEEP = {keep!r}  # selective checkpointing: operators whose outputs a checkpointed layer keeps
BATCH_SIZE = {batch!r}  # the batch (per device) the policy was found for


def apply(model):
    """Checkpoint exactly CHECKPOINTED_LAYERS of `model` through transformers' own call, non-reentrant."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    kwargs = {{"use_reentrant": False}}
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
'''


def policy_name(sol) -> str:
    """``layers-0,1,3``, ``full+offload``, ``layers-2+sac-save-matmuls``, ``none``: a found policy's name."""
    if not sol.layers:
        return "none"
    n = every_n_of(sol.layers, sol.depth)
    name = "full" if n == 1 else f"every-{n}" if n else layer_set_name(sol.layers)
    return name + ("+offload" if sol.mode == "offload" else f"+{sol.mode}" if sol.mode else "")


def every_n_of(layers: tuple[int, ...], depth: int) -> int | None:
    """The ``every_n_layers`` that checkpoints exactly `layers` of a `depth`-layer model (0: none), or None."""
    if not layers:
        return 0
    return next((n for n in range(1, depth + 1) if tuple(checkpointed_layers(depth, n)) == tuple(layers)), None)


def training_arguments(layers: tuple[int, ...], depth: int, offload: bool, sac: str, batch: int) -> dict | None:
    """``TrainingArguments`` keywords that run the policy, or None where transformers cannot say it (a layer set
    no every_n_layers gives, or a SAC policy: its context_fn is a function, not a keyword)."""
    n = every_n_of(layers, depth)
    if n is None or sac:
        return None
    out = {"per_device_train_batch_size": batch}
    if n:
        out.update(activation_checkpointing=True,
                   activation_checkpointing_kwargs={"use_reentrant": False, "every_n_layers": n, "offload": offload})
    return out


def policy_file(title: str, why: str, layers: tuple[int, ...], offload: bool, sac: str, batch: int) -> str:
    return POLICY_FILE.format(title=title, why=why, layers=tuple(layers), offload=bool(offload),
                              keep=tuple(SAC_POLICIES[sac]) if sac else (), batch=batch)


def suite_file(name: str, device: str, model_lines: list[str], train_lines: list[str], batch: int, seq: int,
               layers: tuple[int, ...], offload: bool, sac: str, memory_gib: float | None = None,
               description: str = "", every_n: int | None = None) -> str:
    """A suite of the one point the policy is: its model and setup, its batch and length, its layers (or, with
    `every_n`, the ``every_n_layers`` that checkpoints them)."""
    axis = f"every_n_layers = [{every_n}]" if every_n else f"checkpoint_layers = [{json.dumps(list(layers))}]"
    strategy = (f"{axis}\noffload = [{'true' if offload else 'false'}]\nsac = [\"{sac or 'off'}\"]"
                if layers else "every_n_layers = [0]")
    budget = f"memory_budget_gib = {memory_gib!r}\n" if memory_gib else ""
    return (f'[suite]\nname = "{name}"\ndevice = "{device}"\n{budget}'
            + (f"description = {json.dumps(description)}\n" if description else "")
            + "[model]\n" + "\n".join(model_lines) + "\n[train]\n" + "\n".join(train_lines)
            + f"\n[sweep]\nbatch_size = [{batch}]\nseq_len = [{seq}]\n{strategy}\n")
