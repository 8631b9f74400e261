"""Every operator a step dispatches, with the shapes it ran on: the trace the datasheet roofline prices.

:class:`OpRecorder` is a ``TorchDispatchMode`` that files each dispatched aten op under its *signature*
(the op, and its arguments with each tensor replaced by its shape, strides and dtype) and counts the
calls per phase, as :class:`~.flops.FlopCounter` files FLOPs: ``forward``, ``backward``, ``recompute`` (an
op inside backward with grad mode on: non-reentrant checkpoint re-running a layer's forward) and
``optimizer``.  Each entry also carries what one call costs in the units a roofline needs: its FLOPs
(torch's own formulas, :func:`.flops._registry`) and the bytes its tensors span (inputs and outputs; a
broadcast dimension, stride 0, counts once).  Copies the step makes outside the dispatcher's view (the
host↔device copies of offloaded activations) are filed by :meth:`OpRecorder.copy` as ``copy.d2h`` /
``copy.h2d`` entries.

It runs on real or fake tensors alike; the roofline (:mod:`ckptbench.theory.time.roofline`) traces the step on
fake tensors (:func:`ckptbench.theory.time.optrace.trace_case`), so nothing is allocated and nothing is timed
here.  The signature is plain JSON (:func:`signature`), so a trace can be stored and compared.
"""

from __future__ import annotations

import json

import torch
from torch.utils._pytree import tree_flatten

from .flops import PHASES, FlopCounter

# ops that return an alias of an input (no kernel runs, no memory moves): their cost is dispatch alone
ALIASING = frozenset({"aten._unsafe_view", "aten.detach", "aten.alias", "aten.lift_fresh", "aten._reshape_alias"})
ATTENTION = ("aten._scaled_dot_product", "aten._flash_attention", "aten._efficient_attention",
             "aten._cudnn_attention")


def tensor_meta(t: torch.Tensor) -> list:
    """``["T", shape, stride, dtype]``: a tensor's layout, as an entry's key names it (not its device: an op
    between two devices is a ``copy``, priced by the link)."""
    return ["T", list(t.shape), list(t.stride()), str(t.dtype).removeprefix("torch.")]


def _value(x):
    if isinstance(x, torch.Tensor):
        return tensor_meta(x)
    if isinstance(x, (list, tuple)):
        return [_value(v) for v in x]
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        # a scalar's value (AdamW's step size, a softmax scale) changes from step to step and costs the
        # same: one key for all of them
        return ["float"]
    if isinstance(x, torch.dtype):
        return ["dtype", str(x).removeprefix("torch.")]
    if isinstance(x, torch.device):
        return ["device", x.type]
    if isinstance(x, (torch.memory_format, torch.layout)):
        return ["enum", str(x).removeprefix("torch.")]
    if isinstance(x, torch.Generator):
        return ["generator"]
    return ["object", type(x).__name__]


def signature(func, args, kwargs) -> str:
    """The entry's key: the op and its arguments, tensors as :func:`tensor_meta`, as compact JSON."""
    return json.dumps([str(func), _value(list(args)), {k: _value(v) for k, v in sorted(kwargs.items())}],
                      separators=(",", ":"))


def spanned_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel reads or writes of `t`: its elements, a broadcast (stride-0) dimension counted once."""
    elements = 1
    for size, stride in zip(t.shape, t.stride()):
        elements *= size if stride else min(size, 1)
    return elements * t.element_size()


def kind_of(name: str, flops: int, func=None) -> str:
    """``attention`` | ``matmul`` (any op torch counts FLOPs for) | ``view`` (returns an alias) | ``memory``."""
    if name.startswith(ATTENTION):
        return "attention"
    if flops:
        return "matmul"
    if (name.rsplit(".", 1)[0] in ALIASING or name.startswith("profiler.")  # record_function's marks
            or (func is not None and func.is_view)):
        return "view"
    return "memory"


class OpRecorder(FlopCounter):
    """Counts each distinct (op, signature) per phase, and FLOPs per phase as :class:`.flops.FlopCounter`
    does (it is one); ``phase`` is set by the step being traced."""

    def __init__(self, sequence: bool = False) -> None:
        super().__init__()
        self.entries: dict[str, dict] = {}
        self.calls: list[str] | None = [] if sequence else None  # every call's key, in order, when asked
        self.call_phases: list[str] | None = [] if sequence else None  # the phase of each of those calls

    def _phase(self) -> str:
        """The phase the caller set; inside backward, an op the autograd engine runs with grad mode on is a
        checkpointed layer's recomputation (the seed ``backward()`` makes before the engine starts is not)."""
        if self.phase == "backward" and torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1:
            return "recompute"
        return self.phase

    def _entry(self, key: str, op: str, kind: str, flops: int, nbytes: int) -> dict:
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = {"key": key, "op": op, "kind": kind, "flops": flops, "bytes": nbytes,
                                         "counts": dict.fromkeys(PHASES, 0)}
        return entry

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "prim":  # metadata queries (a fake tensor's device), no kernel
            return out
        phase = self._phase()
        key = signature(func, args, kwargs)
        entry = self.entries.get(key)
        if entry is None:
            formula = self.registry.get(func._overloadpacket)
            flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
            # an out= tensor is written, not read: it is an output here
            given = {k: v for k, v in kwargs.items() if k != "out"}
            inputs = [t for t in tree_flatten((args, given))[0] if isinstance(t, torch.Tensor)]
            outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            tensors = inputs + outputs
            kind = "copy" if len({t.device.type for t in tensors}) > 1 else kind_of(str(func), flops, func)
            spans = [spanned_bytes(t) for t in tensors]
            # a copy between devices is priced by the bytes that cross the link: its payload, once
            nbytes = 0 if kind == "view" else max(spans, default=0) if kind == "copy" else sum(spans)
            entry = self._entry(key, str(func), kind, flops, nbytes)
        entry["counts"][phase] += 1
        if self.calls is not None:
            self.calls.append(key)
            self.call_phases.append(phase)
        if entry["flops"]:
            self.flops[phase] += entry["flops"]
            name = str(func._overloadpacket).removeprefix("aten.")
            self.by_op[name] = self.by_op.get(name, 0) + entry["flops"]
        return out

    def copy(self, direction: str, t: torch.Tensor, phase: str | None = None) -> None:
        """A host↔device copy of `t` (``d2h`` or ``h2d``) that the traced step makes but does not dispatch
        here, filed under `phase` (the current one when None)."""
        meta = tensor_meta(t)
        key = json.dumps([f"copy.{direction}", [meta], {}], separators=(",", ":"))
        phase = phase or self._phase()
        self._entry(key, f"copy.{direction}", "copy", 0, spanned_bytes(t))["counts"][phase] += 1
        if self.calls is not None:
            self.calls.append(key)
            self.call_phases.append(phase)

    def trace(self) -> list[dict]:
        """The entries, in the order they first ran."""
        return list(self.entries.values())
