"""A long run measured again (``every=`` / ``at=``): each later measurement is a record of its own, judged as
the first, read back by the report without merging; the training computes what it computes untracked."""

from __future__ import annotations

import pytest
import torch

from ckptbench.point.training import Timing, TrainSpec
from ckptbench.store.records import load_records
from ckptbench.track import TrainerTracker, track

from .test_track_numerics import _model

pytestmark = pytest.mark.e2e
STEPS = 40
SHORT = TrainSpec(timing=Timing(max_steps=4))  # a measurement is at most 1 + 1 + 4 optimizer steps


def _batches(n: int, size: int = 2):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 128, (size, 16), generator=g) for _ in range(n)]


def _loop(out=None, **again):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []

    def one(ids):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())

    if out is None:
        for ids in _batches(STEPS):
            one(ids)
        return losses, [p.detach().clone() for p in model.parameters()], None
    with track(model, optimizer, out=str(out), echo=False, train=SHORT, **again) as t:
        for ids in _batches(STEPS):
            with t.step(ids):
                one(ids)
    return losses, [p.detach().clone() for p in model.parameters()], t.session.records


def test_a_loop_measured_every_12_steps_has_a_record_per_measurement_each_the_firsts_to_the_byte(tmp_path):
    plain = _loop()
    losses, params, records = _loop(tmp_path / "records", every=12)
    assert losses == plain[0] and all(torch.equal(a, b) for a, b in zip(params, plain[1]))
    assert [r["track"]["from_step"] for r in records] == [0, 12, 24, 36]
    assert [r["track"]["measurement"] for r in records] == [0, 1, 2, 3]
    assert all(r["status"] == "ok" and r["verdict"] == "pass" for r in records), [r.get("checks") for r in records]
    assert len({r["case_id"] for r in records}) == 1  # one Case, measured four times
    # nothing in this run drifts: each later memory step measures what the first did, to the byte
    first = records[0]["measurement"]
    for later in records[1:]:
        for key in ("peak_bytes", "mem_after_forward_bytes", "peak_phase", "optimizer_bytes", "peak_breakdown"):
            assert later["measurement"][key] == first[key], key
    assert records[-1]["measurement"]["timed_steps"] == 2  # the run ended two steps after its memory step
    read = load_records(str(tmp_path / "records")).records
    assert [r["track"]["from_step"] for r in read] == [0, 12, 24, 36]  # not merged as repeats


def test_a_trainer_measured_at_named_steps_logs_each_record_and_trains_as_untracked(tmp_path):
    from transformers import Trainer, TrainingArguments

    def run(callback=None):
        model = _model()
        data = [{"input_ids": ids[0], "labels": ids[0]} for ids in _batches(2 * 30, size=1)]
        args = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=30, per_device_train_batch_size=1,
                                 gradient_accumulation_steps=2, learning_rate=1e-3, lr_scheduler_type="constant",
                                 report_to="none", disable_tqdm=True, save_strategy="no", use_cpu=True,
                                 dataloader_pin_memory=False, seed=0, data_seed=0, logging_steps=1)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        if callback is not None:
            trainer.add_callback(callback)
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        return trainer, losses, [p.detach().clone() for p in model.parameters()]

    _, plain_losses, plain_params = run()
    callback = TrainerTracker(out=str(tmp_path / "records"), echo=False, at=[10, 3, 20], train=SHORT)
    trainer, losses, params = run(callback)
    assert losses == plain_losses and all(torch.equal(a, b) for a, b in zip(params, plain_params))
    records = callback.session.records
    # step 3 falls inside the first measurement (steps 0-5): skipped, measurements never overlap
    assert [r["track"]["from_step"] for r in records] == [0, 10, 20]
    assert all(r["status"] == "ok" and r["verdict"] == "pass" for r in records), [r.get("checks") for r in records]
    assert all(r["case"]["grad_accum"] == 2 for r in records)
    assert len({r["measurement"]["peak_bytes"] for r in records}) == 1
    logged = [h for h in trainer.state.log_history if "ckptbench/peak_gib" in h]
    assert len(logged) == 3  # each record's figures reached the Trainer's logs once
    assert trainer.compute_loss.__func__ is Trainer.compute_loss  # the Trainer's own methods, once done
