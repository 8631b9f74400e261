"""What autograd keeps for backward, and which layers backward recomputes.

Only the innermost ``saved_tensors_hooks`` pair runs, so a counter pushed around the model never sees the
tensors that checkpointing (``_checkpoint_hook``) or offload (``save_on_cpu``) pack.  We therefore count
*inside every pack hook that gets pushed*: while :class:`SavedTensorCounter` is active, the function torch
uses to push hooks is wrapped, and each pack hook pushed through it (ours, transformers' offload, torch's
checkpoint) reports the tensor it receives before doing its own work.  Storages are deduplicated per allocation
(:class:`~ckptbench.measure.storage.StorageSerials`: addresses are reused, allocations are not), and parameters (weights saved by matmuls) are kept apart from activations.

:class:`LayerProbe` records each decoder layer's input storage (a forward pre-hook on the layer runs
outside the checkpoint, once per forward) and which layers run their sub-modules again during backward,
which is the direct evidence that ``every_n_layers`` did what it says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .storage import StorageSerials

# A pack hook is known by the qualified name of the function torch or transformers pushes.
HOOK_KINDS = (
    ("save_on_cpu", "offload"),
    ("_checkpoint_hook", "checkpoint"),
    ("_recomputation_hook", "recompute"),
    ("SavedTensorCounter", "default"),
)


def hook_kind(fn) -> str:
    name = getattr(fn, "__qualname__", "") or ""
    for prefix, kind in HOOK_KINDS:
        if name.startswith(prefix):
            return kind
    return "other"


@dataclass
class SavedEntry:
    nbytes: int
    kinds: set = field(default_factory=set)
    is_param: bool = False


class SavedTensorCounter:
    """Counts the bytes packed for backward during forward, by the hook that packed them.

    - ``default``: kept as-is by autograd (our outermost hook stands in for autograd's default);
    - ``offload``: packed by ``save_on_cpu``, i.e. moved to host;
    - ``checkpoint``: handed to the checkpoint hook, which keeps a placeholder and recomputes later.
    """

    def __init__(self, serials: StorageSerials, param_keys: set[int]):
        self.serials = serials
        self.param_keys = param_keys
        self.entries: dict[int, SavedEntry] = {}
        self.active = False
        self._orig_push = None

    def _record(self, kind: str, t: torch.Tensor) -> None:
        if not self.active or not isinstance(t, torch.Tensor):
            return
        key = self.serials(t)
        if key is None:
            return
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = SavedEntry(t.untyped_storage().nbytes(), is_param=key in self.param_keys)
        entry.kinds.add(kind)

    def _wrap(self, pack):
        kind = hook_kind(pack)

        def counting_pack(t):
            self._record(kind, t)
            return pack(t)

        return counting_pack

    def _push(self, pack, unpack):
        return self._orig_push(self._wrap(pack), unpack)

    def _default_pack(self, t):
        return t.detach()

    @staticmethod
    def _default_unpack(t):
        return t

    def __enter__(self) -> SavedTensorCounter:
        mod = torch._C._autograd
        self._orig_push = mod._push_saved_tensors_default_hooks
        mod._push_saved_tensors_default_hooks = self._push
        self._outer = torch.autograd.graph.saved_tensors_hooks(self._default_pack, self._default_unpack)
        self._outer.__enter__()
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        self.active = False
        self._outer.__exit__(*exc)
        torch._C._autograd._push_saved_tensors_default_hooks = self._orig_push

    def pause(self) -> None:
        """Stop recording (backward's recomputation packs into its own hook; that is not a save)."""
        self.active = False

    # -- results ------------------------------------------------------------------------------------
    def _sum(self, pred) -> int:
        return sum(e.nbytes for e in self.entries.values() if pred(e))

    def retained_keys(self) -> set[int]:
        return {k for k, e in self.entries.items() if not e.is_param and e.kinds & {"default", "offload", "other"}}

    def summary(self, checkpointed_input_keys: set[int]) -> dict:
        retained = self.retained_keys()
        return {
            "saved_bytes": sum(self.entries[k].nbytes for k in retained),
            "saved_param_bytes": self._sum(lambda e: e.is_param),
            "offloaded_bytes": self._sum(lambda e: not e.is_param and "offload" in e.kinds),
            "checkpoint_packed_bytes": self._sum(
                lambda e: not e.is_param and e.kinds == {"checkpoint"}
            ),
            "checkpointed_input_bytes": sum(self.entries[k].nbytes for k in retained & checkpointed_input_keys),
            "saved_by_hook": {
                kind: self._sum(lambda e, kind=kind: not e.is_param and kind in e.kinds)
                for kind in ("default", "offload", "checkpoint", "other")
            },
        }


class LayerProbe:
    """Per decoder layer: the storage of its input hidden states, and whether backward re-ran it."""

    def __init__(self, serials: StorageSerials, layers: list[torch.nn.Module]):
        self.serials = serials
        self.layers = layers
        self.input_keys: dict[int, int] = {}
        self.recomputed: set[int] = set()
        self.in_backward = False
        self._handles = []

    def __enter__(self) -> LayerProbe:
        for i, layer in enumerate(self.layers):
            self._handles.append(layer.register_forward_pre_hook(self._input_hook(i), with_kwargs=True))
            for child in layer.children():
                self._handles.append(child.register_forward_pre_hook(self._rerun_hook(i)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _input_hook(self, i: int):
        def hook(module, args, kwargs):
            if self.in_backward:
                return None
            hidden = args[0] if args else kwargs.get("hidden_states")
            if isinstance(hidden, torch.Tensor):
                key = self.serials(hidden)
                if key is not None:
                    # the first forward's input: with gradient accumulation later micro-batches run
                    # forward again, but only the first one is counted by the saved-tensor counter
                    self.input_keys.setdefault(i, key)
            return None

        return hook

    def _rerun_hook(self, i: int):
        def hook(module, args):
            if self.in_backward:
                self.recomputed.add(i)
            return None

        return hook

    def keys_of(self, layer_indices: list[int]) -> set[int]:
        return {self.input_keys[i] for i in layer_indices if i in self.input_keys}
