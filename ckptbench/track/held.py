"""What a user's loop holds beyond the sweep's step: the model's output kept through the backward.

``output = model(**batch); loss = output.loss; accelerator.backward(loss)`` (the shape of accelerate's
examples) keeps the whole output, its logits (batch · seq · vocab) among it, alive from the forward's end
until the next forward replaces it; ``loss = model(**batch).loss`` (the sweep's loops, Trainer's
``compute_loss``) frees them before the backward.  The tracker sees which: a weak reference to the output
object of the memory step's first forward, alive or not when its backward is asked for.  The bytes are the
output's own tensors other than the loss (distinct storages), read from the object, not from a meter.
The simulated step is then judged with those bytes at every moment after the first forward's end.
"""

from __future__ import annotations

import weakref

import torch


class OutputWatch:
    """The memory step's first output: a weak reference to it and the bytes of its tensors but the loss."""

    def __init__(self, output, loss: torch.Tensor | None):
        try:
            self.ref = weakref.ref(output)
        except TypeError:  # a tensor or a tuple: no weak reference, so nothing is said
            self.ref = None
        values = output.values() if hasattr(output, "values") else output if isinstance(output, (list, tuple)) else ()
        skip = {loss.untyped_storage().data_ptr()} if loss is not None else set()
        sizes: dict[int, int] = {}
        for v in values:
            if isinstance(v, torch.Tensor) and v.device.type != "meta":
                ptr = v.untyped_storage().data_ptr()
                if ptr not in skip:
                    sizes[ptr] = v.untyped_storage().nbytes()
        self.nbytes = sum(sizes.values())

    def held(self) -> int:
        """The output's bytes if the loop still holds the output, else 0."""
        return self.nbytes if self.ref is not None and self.ref() is not None else 0


def with_held_output(sim: dict, held: int, grad_accum: int) -> dict:
    """The simulated step of a loop that holds `held` bytes of output from the first forward's end: its
    after-forward and every later moment carry them (a forward peak of a one-micro-batch step comes before,
    the previous step's output being outside the measured step)."""
    out = dict(sim)
    out["mem_after_forward_bytes"] = sim["mem_after_forward_bytes"] + held
    out["activations_after_forward_bytes"] = sim["activations_after_forward_bytes"] + held
    if sim.get("peak_phase") != "forward" or grad_accum > 1:
        out["peak_bytes"] = sim["peak_bytes"] + held
        breakdown = dict(sim.get("peak_breakdown") or {})
        breakdown["activations"] = breakdown.get("activations", 0) + held
        out["peak_breakdown"] = breakdown
    return out


def judge_with_held_output(case, measurement: dict, held: int) -> None:
    """The measurement is judged against its simulated step with `held` bytes of output."""
    sim = measurement.get("simulation")
    if sim:
        measurement["simulation"] = with_held_output(sim, held, case.grad_accum)
    measurement["loop_held_output_bytes"] = held


def held_note(held: int) -> str:
    return (f"the loop holds the model's output (its logits) through the backward: {held:,} B the sweep's "
            "step frees before it, added to the simulated step from the first forward's end")
