"""The caches a step's tensors leave the framework: a read before each module, for the framework probe.

The framework's time per op (Python, the modules' code, autograd's graph, the dispatcher) is probed on the
point's architecture shrunk until its kernels cost nothing (:mod:`ckptbench.run.steptime`).  There the
interpreter's own working set stays in the core's caches from op to op.  In the point's step every op
streams its tensors through them, and the framework's next op finds its own data evicted.  On this
project's 2-core machine (2 MiB L2 a core) a llama probe step of 4.7 ms took 7.8 to 8.0 ms, its reads
taken out, when each of its modules' forward was preceded by a read of 4 or 8 MiB; 1 MiB gave 5.6 ms,
256 KiB 5.1 ms (``scripts/framework_cache_pressure.py``).  Points whose ops move megabytes missed by 5 to
8 % while the plain probe's figure priced them.

:class:`CacheScrub` reproduces the point's traffic around the probe's modules: before each forward of a
leaf module of the probe's decoder layers that runs a kernel (the checkpointed layers' recomputation too),
it reads a buffer as large as the point's forward traffic (every byte its forward and recomputed ops span,
views apart) over those modules' calls (:func:`scrub_bytes`), at most :data:`SCRUB_MAX`.  Its reads' own
time, by the probe's clock, is kept apart so the probe's step can be taken without it.
"""

from __future__ import annotations

SCRUB_MAX = 8 * 2**20  # a read this long evicts this machine's L2 (2 MiB) whole: 4 MiB and 8 MiB did alike


def forward_traffic(entries: list[dict]) -> int:
    """The bytes a step's forward and recomputed ops span (each entry's bytes times its calls in those
    phases), views and host↔device copies apart."""
    return int(sum(e.get("bytes", 0) * (e["counts"].get("forward", 0) + e["counts"].get("recompute", 0))
                   for e in entries if e["kind"] not in ("view", "copy")))


def scrub_bytes(traffic: int, calls: int, cap: int = SCRUB_MAX) -> int:
    """The read before each module call: `traffic` over `calls`, at most `cap`, in whole float32 elements;
    0 without traffic or calls."""
    if traffic <= 0 or calls <= 0:
        return 0
    return min(cap, traffic // calls) // 4 * 4


def leaf_modules(layers: list) -> list:
    """The modules of `layers` that hold no other module: where a step's kernels run."""
    return [m for layer in layers for m in layer.modules() if next(m.children(), None) is None]


class CacheScrub:
    """Pre-hooks on the leaf modules of `layers`.  :meth:`counting` finds which of them run a kernel (their
    forward dispatches an op other than a view, by `ops`: the op recorder's running count,
    :meth:`~ckptbench.measure.optrace.OpRecorder.kernel_calls`; a dropout of probability 0 runs none) and
    counts those modules' calls; :meth:`reading` reads `nbytes` before each call of those, its time by
    `clock` summed in :attr:`spent_s`."""

    def __init__(self, layers: list, clock, ops=None):
        self.modules = leaf_modules(layers)
        self.clock = clock
        self.ops = ops
        self.calls = 0
        self.spent_s = 0.0
        self.nbytes = 0
        self._buffer = None
        self._handles: list = []
        self._working: set[int] = set()
        self._before = 0

    def _hook(self, module, args) -> None:
        if self._buffer is None:  # counting
            self._before = self.ops() if self.ops else 0
            return
        self.calls += 1
        t0 = self.clock()
        self._buffer.sum()
        self.spent_s += self.clock() - t0

    def _after(self, module, args, output) -> None:
        if self.ops is None or self.ops() > self._before:
            self._working.add(id(module))
            self.calls += 1

    def off(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def counting(self) -> None:
        """Find the modules that run a kernel, and count their calls, from now until :meth:`off`; nothing
        is read."""
        self._buffer = None
        self._working.clear()
        self.calls, self.spent_s = 0, 0.0
        self._handles = [h for m in self.modules for h in (m.register_forward_pre_hook(self._hook),
                                                           m.register_forward_hook(self._after))]

    def reading(self, nbytes: int) -> None:
        """Read `nbytes` before each module call from now until :meth:`off`."""
        import torch

        if nbytes != self.nbytes or self._buffer is None:
            self._buffer = torch.ones(max(1, nbytes // 4))
            self.nbytes = nbytes
        self.calls, self.spent_s = 0, 0.0
        self._handles = [m.register_forward_pre_hook(self._hook) for m in self.modules if id(m) in self._working]
