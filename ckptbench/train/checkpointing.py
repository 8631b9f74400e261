"""Switching checkpointing on exactly as users do: transformers' own API, non-reentrant, with offload.

Also what a CPU-only torch build needs for transformers' offload path to run at all (it asks
``save_on_cpu`` for pinned memory, which such a build cannot allocate).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

import torch

from ..point.strategy import SAC_POLICIES, Recompute


def enable_checkpointing(model: torch.nn.Module, every_n_layers: int, offload: bool,
                         recompute: Recompute | None = None) -> str | None:
    """Checkpointing exactly as users switch it on: transformers' own API, non-reentrant mode.

    `use_reentrant=False` must be passed explicitly: kwargs without it fall back to reentrant mode.
    Returns the name of the method used.  transformers releases before `activation_checkpointing_enable`
    (5.17 and earlier) take the same `every_n_layers` / `offload` arguments in `gradient_checkpointing_enable`,
    which newer releases keep as a deprecated alias; the older name is used only when the new one is absent.

    A layer set (``recompute.layers``) switches checkpointing on for every block through the same call,
    then sets each block's flag as transformers' ``_set_gradient_checkpointing`` does for ``every_n_layers``
    (:func:`select_layers`); a SAC policy (``recompute.sac``) travels in the checkpoint kwargs as torch's
    ``context_fn`` (:func:`sac_context_fn`).
    """
    layers, sac = (recompute.layers, recompute.sac) if recompute else ((), "")
    if every_n_layers <= 0 and not layers:
        return None
    prefix = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
    method = f"{prefix}_checkpointing_enable"
    getattr(model, method)(**{f"{prefix}_checkpointing_kwargs": checkpoint_kwargs(sac)},
                           every_n_layers=1 if layers else every_n_layers, offload=offload)
    if layers:
        select_layers(model, layers)
    return method


def checkpoint_kwargs(sac: str = "") -> dict:
    """What transformers hands to ``torch.utils.checkpoint.checkpoint`` for every checkpointed block."""
    return {"use_reentrant": False, **({"context_fn": sac_context_fn(sac)} if sac else {})}


def select_layers(model: torch.nn.Module, layers) -> None:
    """Checkpoint exactly the blocks `layers` (indices in transformers' order, :func:`decoder_layers`):
    each ``GradientCheckpointingLayer``'s ``gradient_checkpointing`` flag set as transformers sets it for
    ``every_n_layers``, its checkpoint function (transformers', with offload where asked) left as it is."""
    wanted = set(layers)
    for i, block in enumerate(decoder_layers(model)):
        block.gradient_checkpointing = i in wanted


def sac_policy(names: tuple[str, ...]):
    """A selective-checkpoint policy: keep the outputs of the operators `names` (``aten.mm`` ...),
    recompute every other one."""
    from torch.utils.checkpoint import CheckpointPolicy

    keep = frozenset(names)

    def policy(ctx, op, *args, **kwargs):
        name = str(getattr(op, "overloadpacket", op))
        return CheckpointPolicy.MUST_SAVE if name in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def sac_context_fn(sac: str):
    """torch's ``context_fn`` for a policy of :data:`~ckptbench.point.strategy.SAC_POLICIES`: a fresh pair of
    selective-checkpoint contexts for each checkpointed call, as torch's documentation builds it."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return functools.partial(create_selective_checkpoint_contexts, sac_policy(SAC_POLICIES[sac]))


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


@contextmanager
def offload_for(case):
    """Run the offload a point asks for, and yield what its record states of it: ``offload_kind``
    (``"transformers"``, ``"streamed"``; None without offload), ``offload_pinned`` (host buffers pinned),
    ``offload_moved`` (saved tensors left the device's memory: only on CUDA; on a CPU the host is the
    device) and ``offload_note``.  Transformers' offload runs as this build allows
    (:func:`offload_as_this_build_allows`); the streamed one through :mod:`.streamed`."""
    if not case.offload:
        yield {"offload_kind": None, "offload_pinned": None, "offload_moved": None, "offload_note": ""}
        return
    if case.recompute.offload == "streamed":
        from .streamed import streamed_offload

        with streamed_offload(case.device) as hooks:
            yield {"offload_kind": "streamed", "offload_pinned": hooks.streams, "offload_moved": hooks.streams,
                   "offload_note": "" if hooks.streams else (
                       "no CUDA device: streamed offload has no side stream here and keeps each saved tensor "
                       "where it is (a CPU's host memory is its device memory); nothing moved")}
        return
    with offload_as_this_build_allows(True) as pin_error:
        yield {"offload_kind": "transformers", "offload_pinned": pin_error is None,
               "offload_moved": case.device == "cuda",
               "offload_note": (f"this torch build has no pinned allocator ({pin_error}); transformers' offload "
                                "ran with pin_memory=False") if pin_error else ""}
