"""What ckptbench.track reads from a user's objects: the model's spec (a preset's model reads back as the
preset, any other key survives a rebuild), the checkpointing transformers switched on, the optimizer, the
batch's shape."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ckptbench.point.case import preset
from ckptbench.track.inspect import batch_shape, checkpoint_setting, model_spec, optimizer_setting
from ckptbench.train.models import build_model


@pytest.fixture(scope="module")
def tiny():
    return build_model(preset("llama-tiny"))


def test_a_presets_model_reads_back_as_the_preset(tiny):
    assert model_spec(tiny) == preset("llama-tiny")


def test_a_changed_key_is_kept_and_rebuilds_the_same_config():
    spec = dataclasses.replace(preset("llama-tiny"), name="", config='{"hidden_act":"gelu"}')
    model = build_model(spec)
    seen = model_spec(model)
    assert seen.name == "" and seen.config_extra == {"hidden_act": "gelu"}
    assert build_model(seen).config.to_dict() == model.config.to_dict()


def test_checkpointing_as_transformers_switched_it_on():
    model = build_model(preset("llama-tiny"))
    assert checkpoint_setting(model) == ([], False, {})
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=2)
    assert checkpoint_setting(model) == ([0, 2], False, {"use_reentrant": False})
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True}, offload=True)
    assert checkpoint_setting(model) == ([0, 1, 2, 3], True, {"use_reentrant": True})


def test_the_optimizer_by_ckptbenchs_name(tiny):
    params = list(tiny.parameters())
    assert optimizer_setting(torch.optim.AdamW(params, lr=3e-4)) == ("adamw", 3e-4, "")
    assert optimizer_setting(torch.optim.AdamW(params, lr=1e-3, foreach=False))[0] == "adamw-loop"
    assert optimizer_setting(torch.optim.SGD(params, lr=0.1, momentum=0.9)) == ("sgd", 0.1, "")
    name, _, why = optimizer_setting(torch.optim.Adam(params, lr=1e-3))
    assert name == "adamw" and "torch.optim.adam.Adam is not one ckptbench names" in why


def test_batch_shape_from_a_tensor_a_mapping_or_a_sequence():
    ids = torch.zeros(3, 17, dtype=torch.long)
    assert batch_shape(ids) == batch_shape({"input_ids": ids, "labels": ids}) == batch_shape((ids, ids)) == (3, 17)


def test_a_failing_record_names_every_check_behind_its_verdict_in_the_line_and_the_report():
    from ckptbench.point.case import Case, preset
    from ckptbench.point.training import TrainSpec
    from ckptbench.report.columns import named_checks
    from ckptbench.store.schema import Record
    from ckptbench.track.figures import failing_named

    case = Case(model=preset("gpt2-tiny"), train=TrainSpec(), batch_size=2, seq_len=8)
    record = {"case_id": case.id, "status": "ok", "case": case.to_dict(), "verdict": "fail",
              "checks": [{"quantity": "peak_bytes", "verdict": "pass"}],
              "meters": {"checks": [{"quantity": "allocator_vs_tracker_bytes", "verdict": "fail"}]},
              "gates": {"meters_disagree": 1}}
    assert failing_named(Record.read(record)) == " (failing: meters.allocator_vs_tracker_bytes, gate meters_disagree)"
    assert failing_named(Record.read({**record, "verdict": "pass"})) == ""
    merged = named_checks(record["checks"], record["meters"]["checks"], record["gates"])
    assert [(c["quantity"], c["verdict"]) for c in merged] == [
        ("peak_bytes", "pass"), ("meters.allocator_vs_tracker_bytes", "fail"), ("gate.meters_disagree", "fail")]
    assert named_checks(record["checks"], None, {"meters_disagree": 0}) is record["checks"]
