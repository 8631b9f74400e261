"""Selective activation checkpointing: its simulated step, its FLOPs, and how a record of it is judged.

The analytic memory walk does not model what a SAC policy keeps, so a SAC point's estimate is the simulated
step (the real step on fake tensors, the policy applied by torch's own selective-checkpoint contexts); the
FLOPs it runs again follow from the policy's kept operators (:func:`ckptbench.theory.time.flops.
recompute_flops_per_token`) and are held here to torch's counter on that simulated step, exactly.
"""

from __future__ import annotations

import functools

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.strategy import SAC_POLICIES, Recompute
from ckptbench.point.training import TrainSpec
from ckptbench.theory.memory.simulate import simulate
from ckptbench.theory.time import flops
from ckptbench.theory.verdicts.annotate import annotate_record

BATCH, SEQ = 1, 64


@functools.cache
def simulated(name: str, attn: str, sac: str):
    return simulate(preset(name, attn=attn), BATCH, SEQ, 1, count_flops=True, recompute=Recompute(sac=sac))


@pytest.mark.parametrize("name, attn", [("llama-tiny", "sdpa"), ("llama-tiny", "eager"), ("qwen2-tiny", "sdpa"),
                                        ("gpt2-tiny", "eager")])
@pytest.mark.parametrize("sac", list(SAC_POLICIES))
def test_the_policys_recomputed_flops_are_what_the_counter_sees(name, attn, sac):
    spec = preset(name, attn=attn)
    counted = simulated(name, attn, sac).counted_flops
    assert counted["recompute"] == flops.recompute_flops_per_token(spec, SEQ, spec.layers, sac=sac) * BATCH * SEQ
    if sac == "save-matmuls":
        assert counted["recompute"] == 0  # every matmul and attention product kept: nothing counted runs twice


def test_saving_nothing_is_plain_checkpointing_to_the_byte():
    plain = simulate(preset("llama-tiny", attn="sdpa"), BATCH, SEQ, 1, count_flops=True)
    sac = simulated("llama-tiny", "sdpa", "save-nothing")
    assert (sac.peak_bytes, sac.peak_phase, sac.peak_breakdown) == (plain.peak_bytes, plain.peak_phase,
                                                                     plain.peak_breakdown)
    assert sac.counted_flops == plain.counted_flops and sac.recomputed_layers == [0, 1, 2, 3]


def _case(sac: str = "save-matmuls") -> Case:
    return Case(model=preset("llama-tiny", attn="sdpa"), train=TrainSpec(), batch_size=BATCH, seq_len=SEQ,
                every_n_layers=1, recompute=Recompute(sac=sac))


def _measurement(sim: dict, **changes) -> dict:
    """What a worker records for the SAC point whose simulation is `sim`, with `changes` applied."""
    m = {key: sim[key] for key in ("params_bytes", "optimizer_bytes", "mem_after_forward_bytes",
                                   "activations_after_forward_bytes", "peak_bytes", "peak_phase",
                                   "checkpointed_input_bytes", "offloaded_bytes", "counted_flops")}
    m.update(checkpointed_layers=[0, 1, 2, 3], recomputed_layers=[0, 1, 2, 3], simulation=sim, losses=[1.0])
    return {**m, **changes}


def test_a_sac_record_is_judged_against_its_simulation_flops_included():
    case = _case()
    sim = simulated("llama-tiny", "sdpa", "save-matmuls").to_dict()
    good = {"status": "ok", "measurement": _measurement(sim)}
    annotate_record(case, good)
    by = {c["quantity"]: c for c in good["checks"]}
    assert good["estimate_source"] == "simulation" and good["estimate"]["peak_bytes"] == sim["peak_bytes"]
    assert by["recompute_flops"]["verdict"] == by["hardware_flops"]["verdict"] == by["peak_bytes"]["verdict"] == "pass"
    # a step that ran more again than the policy says (the policy lost on the way) fails its FLOP check
    more = dict(sim["counted_flops"], recompute=1_000)
    bad = {"status": "ok", "measurement": _measurement(sim, counted_flops=more)}
    annotate_record(case, bad)
    assert {c["quantity"]: c for c in bad["checks"]}["recompute_flops"]["verdict"] == "fail"
    assert bad["verdict"] == "fail"


def test_a_sac_record_without_its_simulation_is_unchecked_never_passed():
    sim = simulated("llama-tiny", "sdpa", "save-matmuls").to_dict()
    m = _measurement(sim)
    del m["simulation"]
    m["simulation_error"] = "RuntimeError: a fake tensor could not run it"
    record = {"status": "ok", "measurement": m}
    annotate_record(_case(), record)
    assert record["estimate_source"] == "none" and record["verdict"] == "unchecked"
    assert "fake tensor" in record["estimate_reason"]
