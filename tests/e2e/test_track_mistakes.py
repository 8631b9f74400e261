"""Each mistake ckptbench.track names, made on purpose in a real run of a tiny Llama, and named; a run
without them names none."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from ckptbench.point.case import preset
from ckptbench.store.records import load_records
from ckptbench.track import track
from ckptbench.train.checkpointing import offload_without_pinning
from ckptbench.train.models import build_model, synthetic_batch

pytestmark = pytest.mark.e2e


def tracked(model, out, seq: int = 64, batch_size: int = 2, steps: int = 7) -> dict:
    """A plain loop of `steps` optimizer steps on `model`, tracked; its record."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batch = synthetic_batch(256, batch_size, seq, 0)
    with track(model, optimizer, out=str(out), echo=False) as t:
        for _ in range(steps):
            with t.step(batch):
                loss = model(input_ids=batch, labels=batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    assert t.record["status"] == "ok"
    return t.record


def names(record: dict) -> list[str]:
    return [m["name"] for m in record["track"]["mistakes"]]


def llama():
    torch.manual_seed(0)
    return build_model(preset("llama-tiny"))


def test_lora_with_reentrant_checkpointing_and_inputs_not_requiring_grad(tmp_path):
    model = get_peft_model(llama(), LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM"))
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True}, every_n_layers=2)
    model.get_base_model().disable_input_require_grads()  # what transformers' call switched on, undone
    record = tracked(model, tmp_path)
    # layer 0's input (the frozen embedding's output) does not require grad: torch never runs it again;
    # layer 2's does (layer 1's adapters are not checkpointed), so it is recomputed
    assert record["measurement"]["recomputed_layers"] == [2]
    assert names(record) == ["nothing-recomputed", "reentrant-frozen-embeddings"]
    assert "not layers [0]" in record["track"]["mistakes"][0]["line"]


def test_reentrant_with_frozen_embeddings_recomputes_nothing(tmp_path):
    model = llama()
    model.get_input_embeddings().requires_grad_(False)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    model.disable_input_require_grads()
    record = tracked(model, tmp_path)
    assert record["measurement"]["recomputed_layers"] == []
    assert names(record) == ["nothing-recomputed", "reentrant-frozen-embeddings"]
    assert "none of them" in record["track"]["mistakes"][0]["line"]
    assert record["track"]["use_reentrant"] is True and record["track"]["unknown"]  # the record says so


def test_checkpointing_while_the_peak_is_the_optimizers(tmp_path):
    model = llama()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    record = tracked(model, tmp_path, seq=8, batch_size=1)  # activations tiny beside AdamW's step
    assert record["measurement"]["peak_phase"] == "optimizer"
    assert names(record) == ["peak-in-optimizer"]


def test_offload_without_pinned_memory(tmp_path):
    model = llama()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}, offload=True)
    with offload_without_pinning():  # transformers' offload with pin_memory=False
        record = tracked(model, tmp_path)
    assert record["case"]["offload"] is True and record["measurement"]["offload_pinned"] is False
    assert names(record) == ["offload-unpinned"]


def test_a_run_without_mistakes_names_none(tmp_path):
    model = get_peft_model(llama(), LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM"))
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    record = tracked(model, tmp_path)  # reentrant, but transformers made the embeddings' output require grad
    assert record["measurement"]["recomputed_layers"] == [0, 1, 2, 3]
    assert names(record) == []


def test_a_run_too_short_to_measure_is_recorded_as_such(tmp_path):
    model = llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = synthetic_batch(256, 1, 16, 0)
    with track(model, optimizer, out=str(tmp_path), echo=False) as t:
        for _ in range(2):  # warm-up and the memory step: no timed step
            with t.step(batch):
                model(input_ids=batch, labels=batch).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    assert t.record["status"] == "skipped" and "ended after 2 optimizer steps" in t.record["reason"]
    assert load_records(str(tmp_path)).records[0]["status"] == "skipped"
