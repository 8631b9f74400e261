"""Exact live bytes on CPU: one entry per live storage, by category, with the peak and its breakdown.

A ``TorchDispatchMode`` sees every tensor an operator returns, keeps one entry per live *storage* (views
and in-place results share their base's storage, so nothing is counted twice) and drops it when the
storage is freed (a ``weakref.finalize`` on the storage's Python object, which torch keeps alive exactly
as long as the C++ storage).  The same tracker serves the CPU memory probe, the local-SGD forward meter
and the FakeTensor simulation, so all three count bytes by one rule.

Two things a tracker keyed on storage creation would miss, both met under FSDP2 (``fully_shard``):

* tensor subclasses that wrap other tensors (DTensor: FSDP2's sharded parameters, their gradients and
  AdamW's state): the wrapper's own storage is a placeholder the size of the *global* tensor; the bytes
  live in the wrapped local tensor.  Every tensor is counted through :func:`plain_tensors`, which flattens
  wrappers (``__tensor_flatten__``) down to the tensors that own memory.
* storages resized in place: FSDP2 frees an unsharded parameter with ``untyped_storage().resize_(0)`` and
  brings it back with ``resize_(nbytes)``.  ``UntypedStorage.resize_`` does not pass through torch's
  dispatcher (a dispatch mode sees no ``aten.resize_``), so while a tracker is entered the method is
  wrapped and every resize changes the storage's entry by the bytes it added or removed.  Verified on
  llama-tiny, world 2 on gloo: without it the tracker never sees the unsharded weights of a layer in
  flight (147,968 B a layer per rank); with it the tracker ends each step at the bytes it began with.
"""

from __future__ import annotations

import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

CATEGORIES = ("params", "grads", "optimizer", "activations")


def plain_tensors(t: torch.Tensor):
    """The tensors that own `t`'s memory: `t` itself, or what a wrapper subclass (DTensor) wraps."""
    if is_traceable_wrapper_subclass(t):
        for name in t.__tensor_flatten__()[0]:
            inner = getattr(t, name)
            if isinstance(inner, torch.Tensor):  # DTensor also names its device mesh
                yield from plain_tensors(inner)
    else:
        yield t


def storage_key(t: torch.Tensor) -> int | None:
    """Identity of the storage a tensor lives in (None for empty or meta tensors).

    The storage object's C pointer, not ``data_ptr``: it is unique among live storages and exists for
    fake tensors too (whose ``data_ptr`` is always 0), so the same tracker serves ``--simulate``.
    """
    if t.device.type == "meta" or t.is_sparse:
        return None
    st = t.untyped_storage()
    if st.nbytes() == 0:
        return None
    return st._cdata


class StorageSerials:
    """A unique number per live allocation.

    Addresses are reused as soon as memory is freed (the forward frees and reallocates all the time),
    so an address alone would merge two different tensors.  A serial is handed out the first time an
    address is seen and retired by a finalizer when that storage is freed, so the next allocation at
    the same address gets a new serial.
    """

    def __init__(self) -> None:
        self._live: dict[int, int] = {}
        self._next = 0

    def __call__(self, t: torch.Tensor) -> int | None:
        key = storage_key(t)
        if key is None:
            return None
        serial = self._live.get(key)
        if serial is None:
            serial = self._live[key] = self._next
            self._next += 1
            weakref.finalize(t.untyped_storage(), self._live.pop, key, None)
        return serial



class LiveStorageTracker(TorchDispatchMode):
    """Exact live bytes per category, and the peak with its breakdown at the moment it was reached.

    Tensors that existed before the mode was entered (parameters, optimizer state, the input batch) are
    registered explicitly with :meth:`track`; everything an operator returns inside the mode is
    registered as ``activations`` until :meth:`recategorize` moves it (a gradient, once accumulated).
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, list] = {}  # storage key -> [nbytes, category]
        self.by_category = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.peak = 0
        self.peak_breakdown = dict(self.by_category)
        # what the step is doing now (set by the caller: forward, backward-layer-3, optimizer ...) and
        # what it was doing when the peak was reached: the moment a prediction must name too
        self.phase = ""
        self.peak_phase = ""
        # a finer name for the moment than `phase` (forward-layer-3, forward-head) and, when `trace` is
        # set, the total after every allocation in each: the simulation reads these to extrapolate a
        # few-layer model's step to many layers (off in measurements: nothing added per allocation)
        self.moment = ""
        self.trace = False
        self.moment_traces: dict[str, list[int]] = {}
        self.host = 0  # bytes moved off the device (see to_host): alive, but not in total
        self.resident_peak = 0  # the peak of total + host: everything alive, wherever it lives
        # the category of a storage first seen when it is resized to a size above zero (FSDP2 regrowing a
        # parameter it freed before the tracker was entered: the caller that knows says "params")
        self.resize_category = "activations"
        self._resize_original = None
        # when set (the memory step's :class:`~.timeline.Timeline` samples), the device total is appended
        # after every change to it: the running total whose maximum is `peak`
        self.samples = None
        # the addresses of the storages registered with `track` (what existed before the step): the
        # allocator meter counts their frees and no other free of a block older than the step
        self.held_addresses: set[int] = set()

    # -- registration -------------------------------------------------------------------------------
    def track(self, tensor: torch.Tensor, category: str) -> None:
        for t in plain_tensors(tensor):
            self._track_plain(t, category)
            if t.device.type == "cpu" and storage_key(t) is not None and not isinstance(t, FakeTensor):
                self.held_addresses.add(t.untyped_storage().data_ptr())

    def _track_plain(self, tensor: torch.Tensor, category: str) -> None:
        key = storage_key(tensor)
        if key is None:
            return
        entry = self._live.get(key)
        if entry is not None:
            self._move(entry, category)
            return
        st = tensor.untyped_storage()
        nbytes = st.nbytes()
        self._live[key] = [nbytes, category]
        weakref.finalize(st, self._free, key)
        self.by_category[category] += nbytes
        self.total += nbytes
        self._note_peak()

    def recategorize(self, tensor: torch.Tensor, category: str) -> None:
        self.track(tensor, category)

    def _move(self, entry: list, category: str) -> None:
        if entry[1] != category:
            self.by_category[entry[1]] -= entry[0]
            self.by_category[category] += entry[0]
            entry[1] = category

    def _free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is None:
            return
        if entry[1] == "host":
            self.host -= entry[0]
        else:
            self.by_category[entry[1]] -= entry[0]
            self.total -= entry[0]
            if self.samples is not None:
                self.samples.append(self.total)

    def to_host(self, key: int | None) -> None:
        """Count a live activation (by storage key) as moved to host memory: it leaves the device total."""
        entry = self._live.get(key)
        if entry is not None and entry[1] == "activations":
            self.by_category["activations"] -= entry[0]
            self.total -= entry[0]
            self.host += entry[0]
            entry[1] = "host"
            if self.samples is not None:
                self.samples.append(self.total)

    def to_device(self, key: int | None) -> None:
        """Count an offloaded activation (by storage key) back on the device, unpacked for backward."""
        entry = self._live.get(key)
        if entry is not None and entry[1] == "host":
            self.host -= entry[0]
            entry[1] = "activations"
            self.by_category["activations"] += entry[0]
            self.total += entry[0]
            self._note_peak()

    def _note_peak(self) -> None:
        if self.samples is not None:
            self.samples.append(self.total)
        self.resident_peak = max(self.resident_peak, self.total + self.host)
        if self.trace:
            self.moment_traces.setdefault(self.moment or self.phase, []).append(self.total)
        if self.total > self.peak:
            self.peak = self.total
            self.peak_breakdown = dict(self.by_category)
            self.peak_phase = self.phase

    def reset_peak(self) -> None:
        self.resident_peak = self.total + self.host
        self.moment_traces = {self.moment or self.phase: [self.total]} if self.trace else {}
        self.peak = self.total
        self.peak_breakdown = dict(self.by_category)
        self.peak_phase = self.phase

    def resized(self, storage, nbytes: int) -> None:
        """A storage was resized in place to `nbytes`: its entry grows or shrinks by the difference (an
        unknown storage grown from nothing is registered under :attr:`resize_category`)."""
        if storage.device.type == "meta":
            return
        key = storage._cdata
        entry = self._live.get(key)
        if entry is None:
            if nbytes == 0:
                return
            entry = self._live[key] = [0, self.resize_category]
            weakref.finalize(storage, self._free, key)
        delta = nbytes - entry[0]
        entry[0] = nbytes
        if entry[1] == "host":
            self.host += delta
        else:
            self.by_category[entry[1]] += delta
            self.total += delta
        if delta > 0:
            self._note_peak()
        elif delta < 0 and self.samples is not None:
            self.samples.append(self.total)

    # -- dispatch -----------------------------------------------------------------------------------
    def __enter__(self):
        original = self._resize_original = torch.UntypedStorage.resize_
        tracker = self

        def resize_(storage, size):
            out = original(storage, size)
            tracker.resized(storage, int(size))
            return out

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        if self._resize_original is not None:
            torch.UntypedStorage.resize_ = self._resize_original
            self._resize_original = None
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                for inner in plain_tensors(t):
                    if storage_key(inner) not in self._live:
                        self._track_plain(inner, "activations")
        return out



def track_training_state(tracker: LiveStorageTracker, model: torch.nn.Module,
                         optimizer: torch.optim.Optimizer | None = None) -> None:
    """Register what exists before a step: parameters and buffers as ``params``, optimizer state as
    ``optimizer`` (views of weights made inside the step then stay parameters, not activations)."""
    for t in (*model.parameters(), *model.buffers()):
        tracker.track(t, "params")
    if optimizer is not None:
        for state in optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    tracker.track(v, "optimizer")
