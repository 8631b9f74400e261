"""Streamed offload (``+offload-streamed``): saved activations to pinned host memory on a side stream,
prefetched one checkpointed layer ahead in backward.

The design follows torchtune's ``OffloadActivations`` (torchtune is not imported): a
``saved_tensors_hooks`` pair whose pack copies each device tensor into a pinned host buffer on a side
CUDA stream and whose unpack brings it back on that stream before the compute stream needs it.  It runs
where transformers' own offload runs: transformers wraps each checkpointed ``GradientCheckpointingLayer``
call in ``save_on_cpu(pin_memory=True)``, called through the name ``transformers.modeling_utils.save_on_cpu``;
:func:`streamed_offload` puts one shared :class:`StreamedOffload` behind that name, so transformers' own
checkpoint call still runs and only the hooks around it change.  Only the innermost hook pair runs and
non-reentrant checkpoint saves the layer's inputs outside its own hooks, so the hooks see each
checkpointed layer's inputs (the hidden states, RoPE's cos/sin, the mask), as ``save_on_cpu`` does.

On CUDA, per checkpointed layer call (a *group*):

- pack: the side stream waits on the compute stream (the tensor is written), a pinned host buffer is
  filled from it with ``non_blocking=True`` on the side stream and an event recorded; the device tensor is
  kept in the forward stash so that its memory is not reused before the copy has read it;
- the layer's call returns (``__exit__``): the compute stream waits on the group's events and the stash is
  dropped.  The copies were issued when the layer began, so they overlap its forward; the input was alive
  through the call anyway, so the stash adds no device memory over transformers' offload;
- unpack (backward, groups in reverse): the first tensor asked of group g brings g to the device (unless it
  was prefetched), then prefetches group g-1 (the checkpointed layer before, whose backward comes next) on
  the side stream; the compute stream waits on a tensor's event before it is used and ``record_stream``
  tells the allocator the compute stream uses it.  One group's inputs are prefetched beyond what
  transformers' offload holds: the extra device memory of this design (``theory/memory/estimate.py``).

A packed tensor is a small object holding its host buffer, freed with the graph as ``save_on_cpu``'s are;
the shared object keeps only the groups' not-yet-unpacked entries (to prefetch them) and the prefetched
device tensors.  A forward that begins after a backward starts a new step's groups, so one object serves
every micro-batch.

Without CUDA there is no stream and no second memory: pack keeps ``tensor.cpu()`` (the tensor itself on
a CPU, exactly what ``save_on_cpu(pin_memory=False)`` keeps) and unpack hands it back, so a CPU step's
memory is transformers' offload's byte for byte and its gradients the plain step's; the record says
nothing moved (``offload_moved: false``).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class _Packed:
    """One saved tensor while backward waits for it: the host copy, where it came from, its group."""

    __slots__ = ("host", "device", "group", "event")

    def __init__(self, host: torch.Tensor, device: torch.device, group: int, event=None):
        self.host, self.device, self.group, self.event = host, device, group, event


class StreamedOffload(torch.autograd.graph.saved_tensors_hooks):
    """The hooks of the module's text; enter once per checkpointed layer call (transformers does)."""

    def __init__(self, device_type: str = "cuda") -> None:
        self.streams = device_type == "cuda" and torch.cuda.is_available()
        self.side = torch.cuda.Stream() if self.streams else None
        self.group = -1  # the group packed now (forward)
        self.in_backward = False
        self.pending: dict[int, list[_Packed]] = {}  # group -> entries not yet unpacked
        self.stash: list[tuple[torch.Tensor, object]] = []  # (device tensor, copy event): forward, this group
        self.fetched: dict[int, torch.Tensor] = {}  # id(_Packed) -> device tensor brought back ahead of use
        # tensors packed, copies issued each way, groups prefetched: what the tests read of a step
        self.counts = {"packed": 0, "d2h": 0, "h2d": 0, "prefetched": 0}
        super().__init__(self.pack, self.unpack)

    def __call__(self, *args, **kwargs) -> StreamedOffload:
        """transformers calls ``save_on_cpu(pin_memory=True, device_type=...)``: the shared object answers."""
        return self

    def __enter__(self):
        if self.in_backward:  # a new forward: the last backward unpacked every group it had
            self.in_backward, self.group = False, -1
            self.pending.clear()
            self.fetched.clear()
        self.group += 1
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        if self.stash:  # the layer's copies were issued as it began: the compute stream waits for them
            compute = torch.cuda.current_stream()
            for _, event in self.stash:
                compute.wait_event(event)
            self.stash.clear()

    def pack(self, tensor: torch.Tensor) -> _Packed:
        self.counts["packed"] += 1
        if not (self.streams and tensor.is_cuda):
            packed = _Packed(tensor.cpu(), tensor.device, self.group)  # a CPU tensor is kept as it is
        else:
            host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=True)
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                host.copy_(tensor, non_blocking=True)
                event = self.side.record_event()
            self.stash.append((tensor, event))
            self.counts["d2h"] += 1
            packed = _Packed(host, tensor.device, self.group)
        self.pending.setdefault(self.group, []).append(packed)
        return packed

    def unpack(self, packed: _Packed) -> torch.Tensor:
        self.in_backward = True
        entries = self.pending.get(packed.group)
        if entries is not None and any(e is packed for e in entries):
            entries[:] = [e for e in entries if e is not packed]
        if not (self.streams and packed.device.type == "cuda"):
            return packed.host.to(packed.device)
        first = id(packed) not in self.fetched and packed.group in self.pending
        if first:
            self._bring([packed, *self.pending[packed.group]])
        if first or packed.group - 1 in self.pending:
            self._prefetch(packed.group - 1)
        tensor = self.fetched.pop(id(packed), None)
        if tensor is None:  # asked again (a graph kept for a second backward): brought back now
            tensor = self._copy_in(packed)
        compute = torch.cuda.current_stream()
        compute.wait_event(packed.event)
        tensor.record_stream(compute)
        if not self.pending.get(packed.group):
            self.pending.pop(packed.group, None)
        return tensor

    def _copy_in(self, packed: _Packed) -> torch.Tensor:
        with torch.cuda.stream(self.side):
            tensor = packed.host.to(packed.device, non_blocking=True)
            packed.event = self.side.record_event()
        self.counts["h2d"] += 1
        return tensor

    def _bring(self, entries: list[_Packed]) -> None:
        for entry in entries:
            if entry.device.type == "cuda" and id(entry) not in self.fetched:  # a CPU tensor never left
                self.fetched[id(entry)] = self._copy_in(entry)

    def _prefetch(self, group: int) -> None:
        entries = [e for e in self.pending.get(group, ()) if e.device.type == "cuda"]
        if group < 0 or not entries or all(id(e) in self.fetched for e in entries):
            return
        self._bring(entries)
        self.counts["prefetched"] += 1


@contextmanager
def streamed_offload(device_type: str):
    """Put one :class:`StreamedOffload` behind the name transformers' offload calls, for as long as the
    context lasts (a run of steps); yields it."""
    import transformers.modeling_utils as mu

    hooks = StreamedOffload(device_type)
    original = mu.save_on_cpu
    mu.save_on_cpu = hooks
    try:
        yield hooks
    finally:
        mu.save_on_cpu = original
