"""The op trace the datasheet roofline prices: deterministic, the real step's own, recompute and copies exact."""

from __future__ import annotations

import collections

import pytest
import torch

from ckptbench.measure.optrace import OpRecorder
from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.theory.time.optrace import trace_case

TINY = preset("llama-tiny", attn="eager")  # 4 layers, hidden 64, MLP 128


def _case(every: int = 0, offload: bool = False, device: str = "cpu", spec=TINY) -> Case:
    return Case(model=spec, train=TrainSpec(), batch_size=2, seq_len=64, every_n_layers=every, offload=offload,
                device=device)


def _counts(entries: list[dict], kernels_only: bool = False) -> collections.Counter:
    """(key, phase) -> calls (of the ops that run a kernel only: no views, when `kernels_only`)."""
    out = collections.Counter()
    for e in entries:
        if kernels_only and e["kind"] == "view":
            continue
        for phase, n in e["counts"].items():
            if n:
                out[(e["key"], phase)] += n
    return out


def _by_op(entries: list[dict], phase: str) -> dict[str, int]:
    out = collections.Counter()
    for e in entries:
        out[e["op"]] += e["counts"][phase]
    return {op: n for op, n in out.items() if n}


@pytest.fixture(scope="module")
def traces() -> dict:
    return {every: trace_case(_case(every)) for every in (0, 2, 1)}


def test_the_trace_is_deterministic_and_counts_every_matmul(traces):
    assert traces[0] == trace_case(_case(0))
    plain = traces[0]
    # forward: q, k, v, o, gate, up, down in each of 4 layers and the LM head; backward: two matmuls each
    # (the input's gradient and the weight's); eager attention: QK^T and AV per layer, two each backward
    assert _by_op(plain, "forward")["aten.mm.default"] == 4 * 7 + 1
    assert _by_op(plain, "backward")["aten.mm.default"] == 2 * (4 * 7 + 1)
    assert _by_op(plain, "forward")["aten.bmm.default"] == 4 * 2
    assert _by_op(plain, "backward")["aten.bmm.default"] == 4 * 2 * 2
    assert not _by_op(plain, "recompute")
    mm = next(e for e in plain if e["op"] == "aten.mm.default" and e["counts"]["forward"])
    assert mm["kind"] == "matmul" and mm["flops"] > 0 and mm["bytes"] > 0
    views = {e["kind"] for e in plain if e["op"] in ("aten.view.default", "aten.t.default", "aten.detach.default")}
    assert views == {"view"}


@pytest.mark.parametrize("every, layers", [(2, 2), (1, 4)])
def test_checkpointing_adds_exactly_the_recomputation(traces, every, layers):
    plain, ckpt = _counts(traces[0], kernels_only=True), _counts(traces[every], kernels_only=True)
    recompute = _by_op(traces[every], "recompute")
    # each checkpointed layer runs its forward again up to its last matmul (non-reentrant checkpoint stops
    # once backward has what it needs: the MLP's down projection is not recomputed)
    assert recompute["aten.mm.default"] == layers * 6
    assert recompute["aten.bmm.default"] == layers * 2
    # nothing else changes: forward, backward and optimizer run the same kernels as without checkpointing
    # (only aliases differ: autograd detaches what it saves, and checkpoint saves nothing of its layers)
    for phase in ("forward", "backward", "optimizer"):
        assert {k: n for k, n in ckpt.items() if k[1] == phase} == {k: n for k, n in plain.items() if k[1] == phase}
    # full checkpointing (4 layers) recomputes twice what every-2 (layers 0 and 2) does, op for op
    if every == 1:
        half = _counts(traces[2])
        assert {k: n for k, n in _counts(traces[1]).items() if k[1] == "recompute"} == {
            k: 2 * n for k, n in half.items() if k[1] == "recompute"}


def test_offload_adds_host_copies_on_cuda_only(traces):
    assert trace_case(_case(1, offload=True)) == traces[1]  # on a CPU the host is the device: nothing moves
    cuda = trace_case(_case(1, offload=True, device="cuda"))
    copies = {e["op"]: e for e in cuda if e["kind"] == "copy"}
    hidden = 2 * 64 * 64 * 4  # one checkpointed layer's input: b × s × h fp32
    assert copies["copy.d2h"]["counts"]["forward"] == 4 and copies["copy.d2h"]["bytes"] == hidden
    assert copies["copy.h2d"]["counts"]["recompute"] == 4 and copies["copy.h2d"]["bytes"] == hidden
    plain_cuda = trace_case(_case(1, device="cuda"))
    assert [e for e in cuda if e["kind"] != "copy"] == plain_cuda


@pytest.mark.parametrize("name, every", [("llama-tiny", 2), ("gpt2-tiny", 1), ("qwen2-tiny", 0)])
def test_the_fake_trace_is_the_real_steps_trace(name, every):
    """The same step run for real, recorded op by op, dispatches exactly the ops the fake trace priced."""
    from ckptbench.train.checkpointing import enable_checkpointing
    from ckptbench.train.models import build_model, synthetic_batch
    from ckptbench.train.optimizers import build_optimizer
    from ckptbench.train.step import forward_loss, train_step

    spec = preset(name, layers=2, attn="sdpa")
    case = _case(every, spec=spec)
    torch.manual_seed(0)
    model = build_model(spec)
    enable_checkpointing(model, every, False)
    optimizer = build_optimizer(case.setup, model, 1e-4)
    batch = synthetic_batch(spec.vocab, case.batch_size, case.seq_len, 0)
    train_step(model, optimizer, batch, 1)  # warm-up: the optimizer's state exists, as in a timed step
    recorder = OpRecorder()
    with recorder:
        loss = forward_loss(model, batch, 1)
        recorder.phase = "backward"
        loss.backward()
        recorder.phase = "optimizer"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    fake = trace_case(case)
    assert _counts(recorder.trace()) == _counts(fake)
    # and the FLOPs and bytes of each: the fake tensors are laid out as the real step's
    assert ({e["key"]: (e["flops"], e["bytes"]) for e in recorder.trace()}
            == {e["key"]: (e["flops"], e["bytes"]) for e in fake})


def test_an_entry_spans_its_inputs_and_outputs_once_each():
    a, b = torch.ones(256, 64), torch.ones(256, 64)  # 64 KiB each
    out = torch.empty(256, 64)
    recorder = OpRecorder()
    with recorder:
        a.mul_(0.37)  # in place: read, then written back
        a.mul_(2.0)  # another scalar, the same entry
        c = a * b  # a new output
        torch.add(a, b, out=out)  # an out= tensor is an output, counted once
        a.t()  # an alias: no bytes at all
        a[:128].sqrt()  # a new output the size of the half it reads
        a + torch.ones(64)  # a broadcast operand: its one row
    spans = {e["op"]: (e["bytes"], sum(e["counts"].values())) for e in recorder.trace()}
    n = 256 * 64 * 4
    assert spans["aten.mul_.Tensor"] == (2 * n, 2) and spans["aten.mul.Tensor"] == (3 * n, 1)
    assert spans["aten.add.out"] == (3 * n, 1) and spans["aten.add.Tensor"] == (2 * n + 64 * 4, 1)
    assert spans["aten.t.default"] == (0, 1) and spans["aten.sqrt.default"] == (n, 1)
    assert c.shape == a.shape
