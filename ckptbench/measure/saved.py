"""What autograd keeps for backward, and which layers backward recomputes.

Only the innermost ``saved_tensors_hooks`` pair runs, so a counter pushed around the model never sees the
tensors that checkpointing (``_checkpoint_hook``) or offload (``save_on_cpu``) pack.  We therefore count
*inside every pack hook that gets pushed*: while :class:`SavedTensorCounter` is active, the function torch
uses to push hooks is wrapped, and each pack hook pushed through it (ours, transformers' offload, torch's
checkpoint) reports the tensor it receives before doing its own work.  Storages are deduplicated per allocation
(:class:`~ckptbench.measure.storage.StorageSerials`: addresses are reused, allocations are not), and parameters (weights saved by matmuls) are kept apart from activations.

:class:`LayerProbe` records each decoder layer's input storage (a forward pre-hook on the layer runs
outside the checkpoint, once per forward) and which layers run their sub-modules again during backward,
which is the direct evidence that ``every_n_layers`` did what it says; with the counter it also says
which layer keeps what for backward (:meth:`SavedTensorCounter.per_layer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .storage import StorageSerials

# A pack hook is known by the qualified name of the function torch or transformers pushes.
HOOK_KINDS = (
    ("save_on_cpu", "offload"),
    ("StreamedOffload", "offload"),  # ckptbench.train.streamed: the streamed offload's pack
    ("_checkpoint_hook", "checkpoint"),
    ("_recomputation_hook", "recompute"),
    ("SavedTensorCounter", "default"),
)


RETAINING = frozenset({"default", "offload", "other"})  # the hooks whose packed tensors stay alive for backward


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
    layer: int | None = None  # the decoder layer whose forward ran when a hook first kept it (not checkpoint's)
    placed: bool = False


class SavedTensorCounter:
    """Counts the bytes packed for backward during forward, by the hook that packed them.

    - ``default``: kept as-is by autograd (our outermost hook stands in for autograd's default);
    - ``offload``: packed by ``save_on_cpu``, i.e. moved to host;
    - ``checkpoint``: handed to the checkpoint hook, which keeps a placeholder and recomputes later.
    """

    def __init__(self, serials: StorageSerials, param_keys: set[int], layer_of=None):
        self.serials = serials
        self.param_keys = param_keys
        self.layer_of = layer_of  # () -> index of the decoder layer whose forward is running, or None
        self.checkpoint_layers: set[int] = set()  # layers inside which torch's checkpoint hook packed
        self.entries: dict[int, SavedEntry] = {}
        self.active = False
        self._orig_push = None

    def _record(self, kind: str, t: torch.Tensor) -> None:
        if not self.active or not isinstance(t, torch.Tensor):
            return
        if kind == "checkpoint" and self.layer_of is not None and self.layer_of() is not None:
            self.checkpoint_layers.add(self.layer_of())
        key = self.serials(t)
        if key is None:
            return
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = SavedEntry(t.untyped_storage().nbytes(), is_param=key in self.param_keys)
        entry.kinds.add(kind)
        if not entry.placed and kind in RETAINING:
            entry.placed = True
            entry.layer = self.layer_of() if self.layer_of is not None else None

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
        return {k for k, e in self.entries.items() if not e.is_param and e.kinds & RETAINING}

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

    def per_layer(self, n_layers: int, input_keys: dict[int, int]) -> dict:
        """The retained bytes (those of ``saved_bytes``) by the decoder layer that keeps them for backward.

        A tensor belongs to the layer whose forward first kept it (a hook that keeps it: autograd's own,
        offload's; a checkpointed layer only hands tensors to the checkpoint, which keeps none), except a
        layer's input, which belongs to that layer: a checkpointed layer's input is saved by the checkpoint
        before the layer's own forward starts.  A tensor several layers save (rotary cos/sin, an attention
        mask) counts once, in the first layer that kept it.  What no layer kept (the embedding's indices,
        the final norm's and the head's inputs, the loss's logits) is ``saved_outside_layers_bytes``, so
        the layers and the outside sum to ``saved_bytes`` exactly.  ``offloaded_bytes_per_layer`` is the
        part moved to host.
        """
        owner = {key: i for i, key in input_keys.items() if i < n_layers}
        saved, offloaded, outside = [0] * n_layers, [0] * n_layers, 0
        for key in self.retained_keys():
            entry = self.entries[key]
            layer = owner.get(key, entry.layer)
            if layer is None or not 0 <= layer < n_layers:
                outside += entry.nbytes
                continue
            saved[layer] += entry.nbytes
            if "offload" in entry.kinds:
                offloaded[layer] += entry.nbytes
        return {"saved_bytes_per_layer": saved, "offloaded_bytes_per_layer": offloaded,
                "saved_outside_layers_bytes": outside}


class LayerProbe:
    """Per decoder layer: the storage of its input hidden states, whether backward re-ran it, and when
    its backward began.

    Backward reaches layer i when the gradient of layer i+1's input (the last layer: of its output) is
    complete; a tensor hook on that hidden state says so to ``on_phase`` (``backward-layer-i``, and
    ``backward-embedding`` after layer 0), so the memory probe can name the moment of its peak.  The
    hooks only observe: they return nothing and keep no tensor alive.  ``on_mark``, when given, hears
    ``forward-layer-i`` and ``forward-layer-i-end`` around each layer's forward and ``recompute-layer-i``
    when backward runs layer i again (the memory timeline's layer marks).
    """

    def __init__(self, serials: StorageSerials, layers: list[torch.nn.Module], on_phase=None, on_mark=None):
        self.serials = serials
        self.layers = layers
        self.on_phase = on_phase
        self.on_mark = on_mark
        self.input_keys: dict[int, int] = {}
        self.recomputed: set[int] = set()
        self.current: int | None = None  # the layer whose forward runs now (None between layers)
        self.in_backward = False
        self._rerun_marked: int | None = None
        self._handles = []

    def __enter__(self) -> LayerProbe:
        for i, layer in enumerate(self.layers):
            self._handles.append(layer.register_forward_pre_hook(self._input_hook(i), with_kwargs=True))
            if i == len(self.layers) - 1:
                self._handles.append(layer.register_forward_hook(self._output_hook(i)))
            self._handles.append(layer.register_forward_hook(self._leave_hook(i)))
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
            self.current = i
            self._rerun_marked = None
            if self.on_mark is not None:
                self.on_mark(f"forward-layer-{i}")
            hidden = args[0] if args else kwargs.get("hidden_states")
            if isinstance(hidden, torch.Tensor):
                self._announce(hidden, f"backward-layer-{i - 1}" if i else "backward-embedding")
                key = self.serials(hidden)
                if key is not None:
                    # the first forward's input: with gradient accumulation later micro-batches run
                    # forward again, but only the first one is counted by the saved-tensor counter
                    self.input_keys.setdefault(i, key)
            return None

        return hook

    def _output_hook(self, i: int):
        def hook(module, args, output):
            if not self.in_backward:
                hidden = output[0] if isinstance(output, tuple) else output
                if isinstance(hidden, torch.Tensor):
                    self._announce(hidden, f"backward-layer-{i}")
            return None

        return hook

    def _leave_hook(self, i: int):
        def hook(module, args, output):
            if not self.in_backward:
                self.current = None
                if self.on_mark is not None:
                    self.on_mark(f"forward-layer-{i}-end")
            return None

        return hook

    def _announce(self, hidden: torch.Tensor, phase: str) -> None:
        """When `hidden`'s gradient is complete, backward enters `phase`."""
        if self.on_phase is None or not hidden.requires_grad:
            return
        on_phase = self.on_phase

        def hook(grad):
            on_phase(phase)

        hidden.register_hook(hook)

    def _rerun_hook(self, i: int):
        def hook(module, args):
            if self.in_backward:
                self.recomputed.add(i)
                if self.on_mark is not None and self._rerun_marked != i:
                    self._rerun_marked = i
                    self.on_mark(f"recompute-layer-{i}")
            return None

        return hook

    def keys_of(self, layer_indices: list[int]) -> set[int]:
        return {self.input_keys[i] for i in layer_indices if i in self.input_keys}
