"""How long each operator of a traced step takes on this device: microbenchmarks, one per distinct signature.

An entry of an op trace (:mod:`.optrace`) names the aten op and its arguments, each tensor by shape,
strides and dtype.  :func:`time_entry` makes tensors laid out that way on the device (floats drawn from
[0.5, 1.5): no NaN from a square root or a logarithm, no denormals, whose slow paths the real step does not
take; integers 0, a valid index for any embedding or target; booleans true), calls the op once to warm it,
then times it: trials of back-to-back calls, each long enough for the clock, the median trial's time per
call kept, in the CPU time of the calling thread on a one-thread CPU (:func:`clock`).  A
mutating op (``mul_``, ``lerp_``, AdamW's in-place updates) runs on the same tensors every call, as it does
in the step.  A matmul on a CPU keeps its first matrix (what the op before it wrote) but takes its other
operands (a weight, a saved activation, a bias) from the next places of a pool twice the last-level cache,
call after call (:mod:`.coldoperands`): in the step those were last touched a layer or a step before.  An
op that cannot be replayed from its signature (an argument that is not data: a Python object) gives None,
and the cost model prices it from its bytes instead.  On a GPU an op is timed by its kernels alone
(:func:`time_kernels`): the calls are queued while the device sleeps, so they run back to back however
long the host takes to launch them; the host's time is the framework's (the cost model takes the longer
of the two), and timed from the host a small kernel would be priced at its launch.

Also here: the per-call time of the cheapest op the dispatcher serves (an alias, :func:`dispatch_overhead`),
this device's copy bandwidth for an op-less estimate (:func:`memory_bandwidth`) and the rate an in-place op
reads and writes back beyond the caches (:func:`inplace_bandwidth`), and on CUDA the pinned host↔device
copies that offload makes (``copy.d2h`` / ``copy.h2d`` entries).
"""

from __future__ import annotations

import functools
import itertools
import json
import statistics
import time
from collections.abc import Callable

import torch

from .coldoperands import cold_operand_calls, span_elements
from .heapfaults import minor_faults

TRIAL_S = 5e-4  # a trial runs at least this long (or one call, when one call is longer)
TRIALS = 5
LONG_S = 0.05  # an op this long is timed in three single calls after its warm-up call
OTHER_FLOAT = 0.37  # a scalar no kernel takes a shortcut for, where the trace kept none (SPECIAL_FLOATS)
MUTATING_REPS = 8  # back-to-back calls of an in-place op per trial at most: its values stay near 1
# cycles a second that no GPU's clock reaches: a sleep of t seconds at this rate lasts t or longer
SLEEP_CYCLES_PER_S = 2.5e9
QUEUE_S = 1e-3  # the longest a call takes the host to queue (a foreach op over a model's tensors: a fraction)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_tensor(meta: list, device: str) -> torch.Tensor:
    """A tensor with the shape, strides and dtype of a :func:`.optrace.tensor_meta`."""
    _, shape, stride, dtype = meta
    dt = getattr(torch, dtype)
    span = span_elements(shape, stride)
    if dt.is_floating_point or dt.is_complex:
        base = torch.rand(span, dtype=dt, device=device) + 0.5
    elif dt == torch.bool:
        base = torch.ones(span, dtype=dt, device=device)
    else:
        base = torch.zeros(span, dtype=dt, device=device)
    return base.as_strided(shape, stride)


class NotReplayable(Exception):
    """An argument the signature cannot rebuild."""


def make_value(v, device: str):
    if isinstance(v, list) and v and v[0] == "T" and len(v) == 4 and isinstance(v[1], list):
        return make_tensor(v, device)
    if isinstance(v, list) and v and isinstance(v[0], str):
        tag = v[0]
        if tag == "float":
            return OTHER_FLOAT if v[1] == "other" else float(v[1])
        if tag == "dtype":
            return getattr(torch, v[1])
        if tag == "device":
            return torch.device(device)
        if tag == "enum":
            return getattr(torch, v[1])
        if tag == "generator":
            return None
        raise NotReplayable(f"{tag} {v[1:]}")
    if isinstance(v, list):
        return [make_value(x, device) for x in v]
    return v


def resolve(name: str):
    """``aten.mm.default`` -> ``torch.ops.aten.mm.default``."""
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def _is_mutating(func) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


def clock(device: str):
    """What a trial is timed with: on a CPU running one thread, the CPU time of this thread (what the op
    costs, whatever else the machine runs: a shared machine preempts a long call now and then, and the
    wall clock would count the wait); with more threads, or on a GPU (synchronised), the wall clock."""
    if device == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def _trial_shape(once: float, reps_cap: int | None, trials: int) -> tuple[int, int]:
    """(calls a trial, trials) for a call that took `once` seconds: a trial at least :data:`TRIAL_S` long,
    1,000 calls at most (`reps_cap` fewer); at most three trials of an op longer than :data:`LONG_S`."""
    reps = max(1, min(int(TRIAL_S / max(once, 1e-7)), 1000, reps_cap or 1000))
    return reps, trials if once < LONG_S else min(trials, 3)


def time_call(call, device: str, reps_cap: int | None = None, trials: int = TRIALS,
              faults: list | None = None, in_turn: Callable[[int], list | None] | None = None) -> float:
    """Seconds per call of `call`: one call to warm it (and to size the trials), then `trials` trials of
    back-to-back calls (at most three single calls for an op longer than :data:`LONG_S`), their median: in
    CPU time a trial is never slowed by waiting for the core, only by what shares its caches and memory,
    as the step's own ops are.  `faults`, where given, is appended the minor page faults per call of the
    trials (an output mapped afresh each call faults every call: :mod:`.heapfaults`).  `in_turn`, where
    given, makes calls of the same op for the trials to make one after another instead of `call`, given
    how many the trials make (on operands elsewhere in memory: :func:`.coldoperands.cold_operand_calls`)."""
    now = clock(device)
    t0 = now()
    call()
    _sync(device)
    once = now() - t0
    reps, runs = _trial_shape(once, reps_cap, trials)
    per_call = []
    faulted = minor_faults()
    calls = itertools.cycle((in_turn and in_turn(runs * reps)) or [call])
    for _ in range(runs):
        t0 = now()
        for c in itertools.islice(calls, reps):
            c()
        _sync(device)
        per_call.append((now() - t0) / reps)
    if faults is not None:
        faults.append((minor_faults() - faulted) / (runs * reps))
    return statistics.median(per_call)


def time_kernels(call, reps_cap: int | None = None, trials: int = TRIALS) -> float:
    """On a GPU, seconds per call of the kernels `call` launches, their launch apart.  One host-timed trial
    warms the call and bounds how long the host takes to queue it; then each trial puts the device to
    sleep for twice the host's time of the trial's calls (a call's at most :data:`QUEUE_S`), queues them
    behind the sleep between two CUDA events, and reads the device's time between the events: the calls'
    kernels back to back, no launch gaps.  On an H200 a 64 Ki-float ``cos`` timed from the host took
    8.7 µs a call, its launch.  Without torch's sleep kernel, the host-timed figure."""
    host = time_call(call, "cuda", reps_cap, trials=1)
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return host
    reps, runs = _trial_shape(host, reps_cap, trials)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(runs):
        sleep(int(2 * min(host, QUEUE_S) * reps * SLEEP_CYCLES_PER_S))
        start.record()
        for _ in range(reps):
            call()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(per_call)


def entry_call(entry: dict, device: str):
    """(the entry's op, a call of it on tensors made on `device` as its signature lays them out); raises
    :class:`NotReplayable` for an argument the signature cannot rebuild."""
    func = resolve(entry["op"])
    _, args, kwargs = json.loads(entry["key"])
    args, kwargs = make_value(args, device), {k: make_value(v, device) for k, v in kwargs.items()}
    return func, functools.partial(func, *args, **kwargs)


def time_entry(entry: dict, device: str = "cpu", trials: int = TRIALS, faults: list | None = None) -> float | None:
    """Seconds one call of the entry's op takes here (the median of `trials`), or None when it cannot be
    replayed (`faults`: as :func:`time_call`'s).  A matmul on a CPU is timed with its operands other than
    the first matrix taken from beyond the caches (:func:`.coldoperands.cold_operand_calls`)."""
    op = entry["op"]
    if entry["kind"] == "copy":  # between host and device: the pinned copy, never a replay on one device
        return time_copy(entry, device) if op.startswith("copy.") else None
    try:
        func, call = entry_call(entry, device)
        mutating = _is_mutating(func)
        cap = MUTATING_REPS if mutating else None
        with torch.no_grad():
            if device == "cuda":
                return time_kernels(call, cap, trials)
            in_turn = None
            if entry["kind"] == "matmul" and not mutating:
                in_turn = functools.partial(cold_operand_calls, func, call.args, call.keywords)
            return time_call(call, device, cap, trials, faults, in_turn)
    except (NotReplayable, RuntimeError, TypeError, ValueError, AttributeError, IndexError) as exc:
        entry.setdefault("replay_error", f"{type(exc).__name__}: {exc}"[:200])
        return None


def time_copy(entry: dict, device: str) -> float | None:
    """A pinned host↔device copy of the entry's tensor (CUDA); None elsewhere: on a CPU nothing moves."""
    if device != "cuda":
        return None
    _, metas, _ = json.loads(entry["key"])
    dev = make_tensor(metas[0], "cuda").contiguous()
    host = torch.empty(dev.shape, dtype=dev.dtype, pin_memory=True)
    if entry["op"] == "copy.d2h":
        return time_call(lambda: host.copy_(dev, non_blocking=True), device)
    return time_call(lambda: dev.copy_(host, non_blocking=True), device)


def dispatch_overhead(device: str = "cpu") -> float:
    """Seconds per call of an op that does no work (an alias of a small tensor): the dispatcher's own cost."""
    x = torch.ones(8, device=device)
    alias = torch.ops.aten.alias.default
    return time_call(lambda: alias(x), device)


BANDWIDTH_BYTES = 128 * 2**20


def copy_buffers(device: str = "cpu", nbytes: int = BANDWIDTH_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """A source and a destination of `nbytes` each, every page written (:func:`copy_once`)."""
    src = torch.ones(nbytes // 4, device=device)
    return src, torch.empty_like(src).copy_(src)


def memory_bandwidth(device: str = "cpu", nbytes: int = BANDWIDTH_BYTES) -> float:
    """Bytes per second a device-to-device copy moves (read plus write), on buffers beyond the caches (a
    copy of 64 MiB still landed in this machine's 300 MiB last-level cache now and then: 9 to 13 GB/s)."""
    src, dst = copy_buffers(device, nbytes)
    return 2 * nbytes / time_call(lambda: dst.copy_(src), device)


def copy_once(buffers: tuple[torch.Tensor, torch.Tensor], device: str = "cpu") -> float:
    """:func:`memory_bandwidth` from one copy between kept buffers (:func:`copy_buffers`): no warm-up call,
    no page to fault; what a round between a point's steps can afford (25 ms here)."""
    src, dst = buffers
    now = clock(device)
    t0 = now()
    dst.copy_(src)
    _sync(device)
    return 2 * src.nbytes / (now() - t0)


def inplace_once(buffer: torch.Tensor, device: str = "cpu") -> float:
    """Bytes per second an in-place element-wise op spans (its tensor read, then written back) over
    `buffer`, touched once just before it (a pass that puts its value back), so that it meets the buffer
    where the step meets its own tensors: touched one pass ago.  With :func:`copy_once` it splits a
    memory-bound op's floor in two (:mod:`ckptbench.theory.steptime`): the bytes it reads and writes back,
    at this rate, and the bytes it writes fresh, which a copy also reads first (write-allocate)."""
    buffer.mul_(1 / OTHER_FLOAT)
    now = clock(device)
    t0 = now()
    buffer.mul_(OTHER_FLOAT)
    _sync(device)
    return 2 * buffer.nbytes / (now() - t0)


def inplace_bandwidth(device: str = "cpu", nbytes: int = BANDWIDTH_BYTES) -> float:
    """:func:`inplace_once` on a buffer beyond the caches, the median of five."""
    buffer = torch.ones(nbytes // 4, device=device)
    return statistics.median(inplace_once(buffer, device) for _ in range(5))


def matmul_rate(device: str = "cpu", n: int = 4096, dtype: str = "bfloat16") -> float:
    """FLOP/s of an n×n matmul: what an attention kernel that cannot be replayed here is priced at."""
    a = torch.rand(n, n, device=device, dtype=getattr(torch, dtype))
    return 2 * n**3 / time_call(lambda: a @ a, device)


def link_bandwidth(nbytes: int = 256 * 2**20) -> float:
    """Bytes per second of a pinned host-to-device copy (the slower direction is not known in advance:
    both are timed, the slower kept)."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    d2h = time_call(lambda: host.copy_(dev, non_blocking=True), "cuda")
    h2d = time_call(lambda: dev.copy_(host, non_blocking=True), "cuda")
    return nbytes / max(d2h, h2d)


def measure_entries(entries: list[dict], device: str = "cpu", trials: int = TRIALS,
                    faults: dict | None = None) -> dict[str, float]:
    """key -> seconds per call for every entry that is not a view and can be replayed (:func:`time_entry`,
    each once, in order: one round of a step's ops); `faults`, where given, gets key -> minor page faults
    per call."""
    timed = {}
    for e in entries:
        if e["kind"] == "view":
            continue
        seen: list = []
        seconds = time_entry(e, device, trials, seen)
        if seconds is not None:
            timed[e["key"]] = seconds
            if faults is not None and seen:
                faults[e["key"]] = seen[0]
    return timed
