"""Count every c10d collective a rank issues: op, count, payload bytes, bus bytes, time.

Why at the ``torch.ops.c10d`` level: DDP's reducer launches its bucket all-reduces from C++
(``ProcessGroup::allreduce`` -> ``c10d::allreduce_`` through the dispatcher), so wrapping the Python
``dist.all_reduce`` misses exactly the traffic plain DDP is made of.  Both interception points here sit
on the dispatcher and therefore see DDP's buckets, DDP's buffer broadcasts and bucket-index broadcasts,
accelerate's per-parameter all-reduces and barriers, and torch's model averager (verified in
``tests/e2e/test_localsgd.py``; on CPU the reducer's all-reduce runs on the main thread, inside
backward).

:class:`C10dInterposer` registers a Python kernel for each ``c10d`` op at the ``Autograd`` dispatch key,
records into a :class:`CollectiveRecorder`, and redispatches below autograd to the real backend kernel.
Only collectives pay for it; compute ops never enter Python.  The textbook ``TorchDispatchMode`` sees
the same ops (it gave the same counts per step in a 4-step DDP run), but routes every aten op of the
step through Python: on ``llama-tiny`` on CPU it made forward+backward 1.6-1.9x slower, which would
distort the step times recorded next to the counts.

Time: a collective's *issue* time is taken at the call and its *completion* time from a callback on
the ``Work``'s future (run by the backend's thread), so ``comm_s`` is issue-to-completion, overlapped
with compute or not.  How long the training thread was *blocked* is a property of the loop, measured in
:mod:`ckptbench.train.localsgd`.

Functional collectives (``_c10d_functional``, used by compiled graphs and DTensor) are not counted:
nothing in the loops measured here uses them.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from .bus import BUS_FACTORS, bus_bytes

# c10d op -> name of the schema argument holding what this rank hands in (its payload).
PAYLOAD_ARG: dict[str, str | None] = {
    "allreduce_": "tensors",
    "allreduce_coalesced_": "tensors",
    "broadcast_": "tensors",
    "reduce_": "tensors",
    "send": "tensors",
    "recv_": "tensors",
    "recv_any_source_": "tensors",
    "allgather_": "input_tensors",
    "_allgather_base_": "input_tensor",
    "allgather_coalesced_": "input_list",
    "allgather_into_tensor_coalesced_": "inputs",
    "reduce_scatter_": "input_tensors",
    "_reduce_scatter_base_": "input_tensor",
    "reduce_scatter_tensor_coalesced_": "inputs",
    "alltoall_": "input_tensors",
    "alltoall_base_": "input",
    "gather_": "input_tensors",
    "scatter_": "input_tensors",
    "barrier": None,  # its tensor argument is a placeholder, not data
    "monitored_barrier_": None,
}


def op_name(c10d_op: str) -> str:
    """``allreduce_`` -> ``allreduce``: the collective's name without the in-place marker."""
    return c10d_op[:-1] if c10d_op.endswith("_") and c10d_op[:-1] in BUS_FACTORS else c10d_op


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _work_of(result):
    """The ``Work`` a c10d op returned (alone or as the last element of a tuple), unboxed, or None."""
    obj = result[-1] if isinstance(result, tuple) else result
    try:
        return torch._C._distributed_c10d.Work.unbox(obj)
    except Exception:  # noqa: BLE001 - an op without a Work, or a backend that cannot box one
        return None


class CollectiveRecorder:
    """Thread-safe log of collectives, keyed by the step the loop says it is in.

    The loop calls :meth:`set_step` before each iteration (any hashable key: an int, ``"setup"``,
    ``"exit"``) and may tag a region with :meth:`phase`.  :meth:`paused` excludes the meter's own
    collectives (e.g. the divergence all-reduce) from the counts.
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.events: list[dict] = []
        self.step = "setup"
        self._phase = ""
        self._paused = 0
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()

    def set_step(self, key) -> None:
        self.step = key

    @contextmanager
    def phase(self, name: str):
        old, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = old

    @contextmanager
    def paused(self):
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def record(self, c10d_op: str, args: tuple, kwargs: dict, schema, call):
        """Run `call()` (the real collective) and log it unless paused; returns its result."""
        if self._paused:
            return call()
        arg = PAYLOAD_ARG.get(c10d_op)
        payload = 0
        if arg is not None:
            names = [a.name for a in schema.arguments]
            value = kwargs[arg] if arg in kwargs else args[names.index(arg)]
            payload = _nbytes(value)
        name = op_name(c10d_op)
        event = {
            "step": self.step, "phase": self._phase, "op": name, "payload_bytes": payload,
            "bus_bytes": bus_bytes(name, payload, self.world_size) if name in BUS_FACTORS else 0.0,
            "t_issue": time.perf_counter() - self._t0, "t_done": None,
        }
        result = call()
        event["t_return"] = time.perf_counter() - self._t0
        work = _work_of(result)
        if work is not None:
            def done(_fut, event=event):
                event["t_done"] = time.perf_counter() - self._t0
            try:
                work.get_future().add_done_callback(done)
            except Exception:  # noqa: BLE001 - backends without futures: fall back to return time
                event["t_done"] = event["t_return"]
        with self._lock:
            self.events.append(event)
        return result

    def summary(self, step=None) -> dict:
        """``{op: {count, payload_bytes, bus_bytes, comm_s}}`` for one step key, or for all steps."""
        out: dict[str, dict] = defaultdict(lambda: {"count": 0, "payload_bytes": 0, "bus_bytes": 0.0,
                                                    "comm_s": 0.0})
        with self._lock:
            events = list(self.events)
        for e in events:
            if step is not None and e["step"] != step:
                continue
            row = out[e["op"]]
            row["count"] += 1
            row["payload_bytes"] += e["payload_bytes"]
            row["bus_bytes"] += e["bus_bytes"]
            done = e["t_done"] if e["t_done"] is not None else e["t_return"]
            row["comm_s"] += done - e["t_issue"]
        return {k: dict(v) for k, v in out.items()}

    def totals(self, step=None) -> dict:
        """Counts and bytes summed over ops (barriers count as collectives, with 0 bytes)."""
        rows = self.summary(step).values()
        return {
            "collectives": sum(r["count"] for r in rows),
            "payload_bytes": sum(r["payload_bytes"] for r in rows),
            "bus_bytes": sum(r["bus_bytes"] for r in rows),
            "comm_s": sum(r["comm_s"] for r in rows),
        }

    def steps(self) -> list:
        """Step keys in first-seen order."""
        seen: dict = {}
        with self._lock:
            for e in self.events:
                seen.setdefault(e["step"], None)
        return list(seen)


class C10dInterposer:
    """Context manager: every ``torch.ops.c10d`` collective issued inside it is logged to `recorder`.

    Implementation: a ``torch.library`` kernel at the ``Autograd`` key of each op, which the dispatcher
    reaches for any CPU/CUDA tensor before the backend kernel, whether the call came from Python or
    from C++ (DDP's reducer).  The kernel logs and calls the op again below autograd, which lands on the
    real kernel.  The c10d ops have no autograd kernel of their own, so nothing is shadowed, and the
    registration is removed on exit.  Process-wide: use one at a time.
    """

    def __init__(self, recorder: CollectiveRecorder):
        self.recorder = recorder
        self._lib = None

    def _kernel(self, name: str):
        op = getattr(torch.ops.c10d, name).default
        recorder = self.recorder

        def kernel(*args, **kwargs):
            def call():
                with torch._C._AutoDispatchBelowAutograd():
                    return op(*args, **kwargs)
            return recorder.record(name, args, kwargs, op._schema, call)
        return kernel

    def __enter__(self):
        import torch.distributed  # noqa: F401 - loads the c10d op registrations

        self._lib = torch.library.Library("c10d", "IMPL")
        for name in PAYLOAD_ARG:
            if hasattr(torch.ops.c10d, name):
                self._lib.impl(name, self._kernel(name), "Autograd")
        return self.recorder

    def __exit__(self, *exc):
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
        return False


def collective_totals(ops: dict) -> dict:
    """A run's collectives summed over their kinds (``ops``: kind -> count, payload and bus bytes, seconds)."""
    return {"collectives": sum(r["count"] for r in ops.values()),
            "payload_bytes": sum(r["payload_bytes"] for r in ops.values()),
            "bus_bytes": sum(r["bus_bytes"] for r in ops.values()),
            "comm_s": sum(r["comm_s"] for r in ops.values()),
            "ops": ops}
