"""The strategy axis of a suite: ``every_n_layers``, ``checkpoint_layers`` and ``sac`` become the
(every_n_layers, :class:`~ckptbench.point.strategy.Recompute`) of each point, every wrong value a
:class:`SuiteError` naming its key.

``every_n_layers`` and ``checkpoint_layers`` are one axis: the sweep runs each n and each layer set (a
suite that names only layer sets runs only those).  ``sac`` crosses with every strategy that checkpoints
something ("off": plain checkpointing); a SAC policy where nothing is checkpointed means nothing and is
left out, as offload is.  Each value of ``compile_budget`` adds one point more, ``torch.compile`` at that
activation memory budget: the partitioner decides what is recomputed, so such a point checkpoints nothing
through transformers and crosses with no n, layer set, SAC policy or offload.

``offload`` takes ``false``, ``true`` (transformers' own offload) and an offload kind of
:data:`~ckptbench.point.strategy.OFFLOAD_KINDS` (``"streamed"``): :func:`offload_point` turns each value into the
Case's ``offload`` and its Recompute's ``offload``.
"""

from __future__ import annotations

from dataclasses import replace

from ..point.strategy import OFFLOAD_KINDS, SAC_POLICIES, Recompute, compile_budget_problem, layer_set_problem
from .keys import _Checker

SAC_OFF = "off"


def strategies(ck: _Checker, sweep: dict, axes: dict, layers: int) -> list[tuple[int, Recompute]]:
    """(every_n_layers, Recompute) for each strategy of the sweep, in the order the suite names them:
    each n of ``every_n_layers``, then each layer set of ``checkpoint_layers``, each crossed with ``sac``,
    then each ``compile_budget``."""
    if max(axes["every_n_layers"]) > layers:
        ck.fail("sweep.every_n_layers", f"{max(axes['every_n_layers'])} is larger than the model's "
                f"{layers} layers")
    sets = []
    for value in axes["checkpoint_layers"]:
        problem = layer_set_problem(value, layers)
        if problem:
            ck.fail("sweep.checkpoint_layers", problem)
        sets.append(tuple(value))
    for policy in axes["sac"]:
        if policy != SAC_OFF and policy not in SAC_POLICIES:
            ck.fail("sweep.sac", f"unknown policy {policy!r}; known: {SAC_OFF}, {', '.join(SAC_POLICIES)}")
    named_n = "every_n_layers" in sweep or not sets  # only layer sets named: no every_n point beside them
    base = [(n, ()) for n in axes["every_n_layers"] if named_n] + [(0, s) for s in sets]
    checkpoints = any(n > 0 or s for n, s in base)
    for value in axes["offload"]:
        if isinstance(value, str) and value not in OFFLOAD_KINDS:
            ck.fail("sweep.offload", f"unknown offload {value!r}; known: false, true, "
                    + ", ".join(f'"{k}"' for k in OFFLOAD_KINDS))
    if any(v is True or isinstance(v, str) for v in axes["offload"]) and not checkpoints:
        ck.fail("sweep.offload", "offload needs checkpointing: add an every_n_layers value > 0")
    if any(p != SAC_OFF for p in axes["sac"]) and not checkpoints:
        ck.fail("sweep.sac", "a SAC policy applies inside checkpointed layers: add an every_n_layers value > 0 "
                "or a checkpoint_layers set")
    out = []
    for n, layer_set in base:
        for policy in axes["sac"]:
            if policy != SAC_OFF and n == 0 and not layer_set:
                continue
            out.append((n, Recompute(layers=layer_set, sac="" if policy == SAC_OFF else policy)))
    for budget in axes["compile_budget"]:
        problem = compile_budget_problem(budget)
        if problem:
            ck.fail("sweep.compile_budget", problem)
        out.append((0, Recompute(compile_budget=float(budget))))
    return out


def offload_point(value, recompute: Recompute) -> tuple[bool, Recompute]:
    """A value of the ``offload`` axis as a point holds it: (``Case.offload``, the Recompute with its kind)."""
    if isinstance(value, str):
        return True, replace(recompute, offload=value)
    return bool(value), recompute
