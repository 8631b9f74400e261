"""Any causal LM transformers can build: real CPU steps of a dozen model types, each shrunk to 4 small
layers, checked against the simulation of the same step and against the rules that need no model."""

from __future__ import annotations

import pytest

from ckptbench.point.case import Case, ModelSpec, canonical_config
from ckptbench.point.training import TrainSpec
from ckptbench.run.worker import Unsupported, measure
from ckptbench.theory.verdicts.annotate import annotate_record, checkpointed_input_formula
from ckptbench.train.checkpointing import offload_without_pinning
from tests.conftest import covering

pytestmark = pytest.mark.e2e

SMALL = dict(hidden=64, layers=4, heads=4, kv_heads=2, intermediate=128, vocab=256, max_positions=256)
# model_type -> extra config keys that shrink what the dimensions do not (experts, head width, windows)
TYPES = {
    "llama": {"head_dim": 32},  # a head width that is not hidden/heads: simulated, not analytic
    "mistral": {"sliding_window": 16},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2": {"use_sliding_window": False, "attention_dropout": 0.0, "layer_types": None, "max_window_layers": 2,
              "rope_theta": 1e4, "bos_token_id": 0, "initializer_range": 0.02, "sliding_window": 8,
              "vocab_pad": 1},  # a key the analytic model does not know: the simulation takes over
    "qwen3": {"head_dim": 16},
    "qwen3_moe": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "gemma2": {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 16},
    "gemma3_text": {"head_dim": 16, "sliding_window": 16},
    "phi3": {},
    "olmo2": {},
    "gpt_neox": {"rotary_pct": 0.25},
    "starcoder2": {},
    "granite": {},
    "stablelm": {},
}


def _case(model_type: str, every_n: int, offload: bool = False) -> Case:
    spec = ModelSpec(family=model_type, **SMALL, config=canonical_config(TYPES[model_type]))
    return Case(model=spec, train=TrainSpec(warmup_steps=1, memory_steps=1, steps=1), batch_size=2, seq_len=32,
                every_n_layers=every_n, offload=offload)


def _record(case: Case) -> dict:
    with offload_without_pinning() if case.offload else _nothing():
        m = measure(case)
    record = {"status": "ok", "measurement": m, "case": case.to_dict()}
    annotate_record(case, record)
    return record


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# make test runs two of them (a dense model with its own block, a mixture of experts); make test-all runs all
@pytest.mark.parametrize("model_type", covering(sorted(TYPES), keep={sorted(TYPES).index("phi3"), sorted(TYPES).index("qwen3_moe")}))
def test_any_model_type_runs_checkpointed_and_matches_its_simulation(model_type):
    for every_n, offload in ((0, False), (2, True)):
        case = _case(model_type, every_n, offload)
        assert not case.model.analytic
        record = _record(case)
        m = record["measurement"]
        assert m["checkpointed_layers"] == case.checkpointed_layers  # transformers' rule: i % n == 0
        assert m["recomputed_layers"] == case.checkpointed_layers
        assert m["checkpointed_input_bytes"] == checkpointed_input_formula(case)
        assert record["estimate_source"] == "simulation", m.get("simulation_error")
        sim = m["simulation"]
        # the simulation is the same step on fake tensors under the same tracker: equal to the byte
        for key in ("params_bytes", "optimizer_bytes", "mem_after_forward_bytes", "peak_bytes"):
            assert m[key] == sim[key], (model_type, every_n, key, m[key], sim[key])
        assert m["peak_phase"] == sim["peak_phase"]
        assert record["verdict"] == "pass", ([c for c in record["checks"] if c["verdict"] != "pass"], record["gates"],
                                             record["meters"])


@pytest.mark.parametrize("model_type, reason", [("ctrl", "no GradientCheckpointingLayer blocks"),
                                                ("xlnet", "could not build a causal LM")])
def test_a_model_transformers_cannot_checkpoint_or_build_is_unsupported_not_a_crash(model_type, reason):
    spec = ModelSpec(family=model_type, hidden=64, layers=2, heads=4, kv_heads=4, intermediate=128, vocab=256,
                     max_positions=256)
    with pytest.raises(Unsupported, match=reason):
        measure(Case(model=spec, train=TrainSpec(warmup_steps=1, memory_steps=1, steps=1), batch_size=1,
                     seq_len=16, every_n_layers=1))
