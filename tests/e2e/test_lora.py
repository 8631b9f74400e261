"""LoRA adapters through peft, measured on CPU against the simulation of the same peft-wrapped step, to the
byte, under every checkpointing setting and each loop; and a QLoRA point recorded unsupported by a sweep."""

from __future__ import annotations

import warnings

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import PRECISIONS, Lora, Setup
from ckptbench.point.training import TrainSpec
from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.run.worker import measure
from ckptbench.store.records import load_records
from ckptbench.suite.parse import load_suite
from ckptbench.theory.memory.simulate import simulate
from ckptbench.theory.verdicts.annotate import annotate_record
from tests.conftest import covering

pytestmark = [pytest.mark.e2e,
              pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")]
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

QUANTITIES = ("params_bytes", "optimizer_bytes", "mem_after_forward_bytes", "activations_after_forward_bytes",
              "peak_bytes", "peak_phase", "checkpointed_input_bytes", "offloaded_bytes")
STRATEGIES = ((0, False), (2, False), (1, False), (1, True))  # none, every-2, full, full+offload
# llama-tiny's q_proj (64 -> 64) and v_proj (64 -> 32), peft's default targets for llama, r = 8, 4 layers
ADAPTER_PARAMS = 4 * 8 * ((64 + 64) + (64 + 32))


def _case(precision: str, loop: str, every_n: int, offload: bool = False, lora: Lora = Lora(r=8)) -> Case:
    dtype, autocast = PRECISIONS[precision]
    return Case(model=preset("llama-tiny", dtype=dtype, attn="sdpa"), train=TrainSpec(warmup_steps=1, steps=1),
                batch_size=2, seq_len=32, every_n_layers=every_n, offload=offload,
                setup=Setup(autocast=autocast, loop=loop, lora=lora))


GRID = [("fp32", "manual", n, off) for n, off in STRATEGIES]
GRID += [("fp32", "trainer", 1, False), ("fp32", "trainer", 2, False), ("fp32", "accelerate", 2, False),
         ("bf16-mixed", "manual", 0, False), ("bf16-mixed", "trainer", 0, False),
         # a bf16 matmul's scratch (below the dispatcher) meets the saved RNG states here: the meters'
         # allowance names it (theory/verdicts/meters.py)
         ("bf16-mixed", "manual", 1, False),
         # the base loaded in bf16, as the PEFT guides load it (plan's default with --lora): fp32 adapters
         ("bf16", "manual", 0, False), ("bf16", "manual", 1, False)]


@pytest.mark.parametrize("point", covering(GRID, unpack=False), ids=lambda p: "-".join(map(str, p)))
def test_a_lora_step_measures_what_its_simulation_predicts_to_the_byte(point):
    case = _case(*point)
    assert not case.analytic  # LoRA points are estimated by the simulation of their step
    m = measure(case)
    sim = simulate(case.model, case.batch_size, case.seq_len, case.every_n_layers, case.offload,
                   setup=case.setup).to_dict()
    for q in QUANTITIES:
        assert m[q] == sim[q], (q, m[q], sim[q])
    assert m["peak_breakdown"] == sim["peak_breakdown"]
    assert m["trainable_params"] == m["adapter_params"] == ADAPTER_PARAMS
    assert m["lora_targets"] == ["q_proj", "v_proj"] and m["lora_modules"] == 8
    # two fp32 moments and a step scalar for each of the 16 adapter tensors, nothing for the frozen base
    assert m["optimizer_bytes"] == 2 * 4 * ADAPTER_PARAMS + 4 * 16
    assert m["peak_breakdown"]["grads"] <= 4 * ADAPTER_PARAMS
    record = {"status": "ok", "measurement": m}
    annotate_record(case, record)  # as a sweep judges it: by the worker's own simulation
    assert record["estimate_source"] == "simulation" and record["verdict"] == "pass", record["checks"]
    assert record["meters"]["agreement"] == "agree"


def test_adapters_shrink_the_optimizer_state_and_keep_the_base_params():
    lora = measure(_case("fp32", "manual", 1))
    full = measure(_case("fp32", "manual", 1, lora=None))
    assert lora["n_params"] == full["n_params"] == full["trainable_params"]  # the base model's own, as configured
    assert lora["params_bytes"] - full["params_bytes"] == 4 * ADAPTER_PARAMS
    assert full["optimizer_bytes"] > 10 * lora["optimizer_bytes"]


SUITE = """
[suite]
name = "lora"
timeout_s = 120

[model]
preset = "llama-tiny"
attn = "sdpa"

[train]
warmup_steps = 1
memory_steps = 1
steps = 1
max_steps = 1
lora = {{ r = 8, quantize = "{quantize}" }}

[sweep]
batch_size = [2]
seq_len = [32]
every_n_layers = [2]
"""


def test_a_sweep_records_a_lora_point_passed_and_a_qlora_point_unsupported_on_cpu(tmp_path, write_suite):
    records = {}
    for quantize in ("", "nf4"):
        suite = load_suite(write_suite(SUITE.format(quantize=quantize), name=f"lora{quantize}.toml"))
        out = str(tmp_path / f"run{quantize}")
        run_sweep(suite, SweepOptions(out_dir=out, timeout_s=120), annotate=annotate_record)
        [records[quantize]] = load_records(out).records
    lora, qlora = records[""], records["nf4"]
    assert lora["status"] == "ok" and lora["verdict"] == "pass" and lora["estimate_source"] == "simulation"
    assert lora["strategy"] == "every-2+lora8" and lora["measurement"]["trainable_params"] == ADAPTER_PARAMS
    assert qlora["status"] == "unsupported" and qlora["strategy"] == "every-2+qlora8"
    assert "QLoRA (nf4)" in qlora["reason"] and "bitsandbytes" in qlora["reason"]

