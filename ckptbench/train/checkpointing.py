"""Switching checkpointing on exactly as users do: transformers' own API, non-reentrant, with offload.

Also what a CPU-only torch build needs for transformers' offload path to run at all (it asks
``save_on_cpu`` for pinned memory, which such a build cannot allocate).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def enable_checkpointing(model: torch.nn.Module, every_n_layers: int, offload: bool) -> str | None:
    """Checkpointing exactly as users switch it on: transformers' own API, non-reentrant mode.

    `use_reentrant=False` must be passed explicitly: kwargs without it fall back to reentrant mode.
    Returns the name of the method used.  transformers releases before `activation_checkpointing_enable`
    (5.17 and earlier) take the same `every_n_layers` / `offload` arguments in `gradient_checkpointing_enable`,
    which newer releases keep as a deprecated alias; the older name is used only when the new one is absent.
    """
    if every_n_layers <= 0:
        return None
    prefix = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
    method = f"{prefix}_checkpointing_enable"
    getattr(model, method)(**{f"{prefix}_checkpointing_kwargs": {"use_reentrant": False}},
                           every_n_layers=every_n_layers, offload=offload)
    return method


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks, in the order transformers counts them for `every_n_layers`."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def pinned_memory_error() -> str | None:
    """None when this torch build can allocate pinned host memory, else the error it gives."""
    try:
        torch.empty(1, pin_memory=True)
        return None
    except RuntimeError as exc:
        return str(exc).splitlines()[0]


@contextmanager
def offload_without_pinning():
    """Let transformers' offload run on a torch build that has no pinned allocator.

    transformers wraps each checkpointed layer in ``save_on_cpu(pin_memory=True)``, which raises on a
    CPU-only build.  We swap the name transformers calls for the same class with pinning off, so the
    library's own offload path still runs, and the record states ``offload_pinned: false``.
    """
    import transformers.modeling_utils as mu

    original = mu.save_on_cpu

    class unpinned_save_on_cpu(original):  # noqa: N801 - stands in for torch's class name
        def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
            super().__init__(pin_memory=False, device_type=device_type)

    unpinned_save_on_cpu.__qualname__ = "save_on_cpu_unpinned"
    mu.save_on_cpu = unpinned_save_on_cpu
    try:
        yield
    finally:
        mu.save_on_cpu = original


@contextmanager
def offload_as_this_build_allows(offload: bool):
    """Run transformers' offload as this torch build allows: pinned where it has a pinned allocator, else
    unpinned (:func:`offload_without_pinning`).  Yields why it cannot pin (None when it can, or when
    nothing is offloaded), for the record's ``offload_pinned``."""
    error = pinned_memory_error() if offload else None
    if error is None:
        yield None
        return
    with offload_without_pinning():
        yield error
