"""The user's run is sacred: what the tracker can check it checks when it is made; anything ckptbench hits
later ends the tracking with one warning line and leaves the training untouched; nothing but ckptbench's
own notes reaches the terminal."""

from __future__ import annotations

import logging
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ckptbench.run.memory_step import MemoryStepMarks
from ckptbench.track import TrainerTracker, track
from ckptbench.track.out import TrackSetupError

pytestmark = pytest.mark.e2e
ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 8


def _model():
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, intermediate_size=64, vocab_size=128,
                                  max_position_embeddings=64, tie_word_embeddings=False, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model


def _batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 128, (2, 16), generator=g) for _ in range(STEPS)]


def _train(out=None, before=None):
    """A plain loop of STEPS optimizer steps, tracked into `out` when given; `before(tracker)` runs after
    the tracker is made.  Returns (losses, parameters)."""
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
        for ids in _batches():
            one(ids)
    else:
        with track(model, optimizer, out=str(out), echo=False) as t:
            if before:
                before(t)
            for ids in _batches():
                with t.step(ids):
                    one(ids)
    return losses, [p.detach().clone() for p in model.parameters()]


def _same(a, b):
    assert a[0] == b[0]
    assert all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


@pytest.mark.parametrize("make", ["trainer", "loop"])
def test_an_out_that_cannot_be_written_is_refused_when_the_tracker_is_made(tmp_path, make):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = str(blocker / "records")
    with pytest.raises(TrackSetupError) as caught:
        if make == "trainer":
            TrainerTracker(out=out)
        else:
            model = _model()
            track(model, torch.optim.AdamW(model.parameters()), out=out)
    message = str(caught.value)
    assert "\n" not in message and out in message and message.startswith("ckptbench.track: out=")


def _classifier():
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, intermediate_size=64, vocab_size=128, num_labels=2,
                                  max_position_embeddings=64, pad_token_id=0, use_cache=False)
    return AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")


def test_what_is_not_a_causal_lm_is_refused_when_the_tracker_is_made(tmp_path):
    """Its estimate would be of another model (the causal LM of its config): refused in one line, before a
    step, with no hook left on the model."""
    for model in (_classifier(), torch.nn.Sequential(torch.nn.Embedding(128, 16), torch.nn.Linear(16, 128))):
        with pytest.raises(TrackSetupError) as caught:
            track(model, torch.optim.AdamW(model.parameters()), out=str(tmp_path / "records"))
        message = str(caught.value)
        assert "\n" not in message and message.startswith("ckptbench.track: model: ")
        assert type(model).__name__ in message and "causal LM" in message
        assert not model._forward_pre_hooks and not model._forward_hooks
    model = _model()  # a causal LM is taken (inside peft and DDP too: test_track_numerics)
    track(model, torch.optim.AdamW(model.parameters()), out=str(tmp_path / "records")).close()


def test_a_trainer_of_a_classifier_trains_untouched_and_says_why_it_measured_nothing(tmp_path, caplog):
    from transformers import Trainer, TrainingArguments

    def run(callback=None):
        model = _classifier()
        data = [{"input_ids": ids[0], "labels": int(ids[0, 0]) % 2} for ids in _batches()]
        args = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=STEPS, per_device_train_batch_size=1,
                                 learning_rate=1e-3, lr_scheduler_type="constant", report_to="none",
                                 disable_tqdm=True, save_strategy="no", use_cpu=True, dataloader_pin_memory=False,
                                 seed=0, data_seed=0, logging_steps=1)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        if callback is not None:
            trainer.add_callback(callback)
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], [p.detach().clone() for p in model.parameters()]

    plain = run()
    callback = TrainerTracker(out=str(tmp_path / "records"), echo=False)
    with caplog.at_level(logging.WARNING, logger="ckptbench"):
        tracked = run(callback)
    assert tracked[0] == plain[0] and all(torch.equal(a, b) for a, b in zip(tracked[1], plain[1]))
    assert "LlamaForSequenceClassification is a transformers model but not a causal LM" in callback.session.failed
    warned = [r.getMessage() for r in caplog.records if r.name == "ckptbench"]
    assert len([w for w in warned if "stopped measuring" in w]) == 1, warned


def test_a_directory_lost_mid_run_ends_the_tracking_not_the_training(tmp_path, caplog):
    plain = _train()
    out = tmp_path / "records"

    def lose_it(_):  # the directory checked at start is gone by the time the record is written
        shutil.rmtree(out)
        out.write_text("not a directory")

    with caplog.at_level(logging.WARNING, logger="ckptbench"):
        tracked = _train(out, before=lose_it)
    _same(plain, tracked)
    warned = [r.getMessage() for r in caplog.records if r.name == "ckptbench"]
    assert any("stopped measuring" in w and "the training goes on untouched" in w for w in warned), warned


def test_a_probe_that_fails_in_the_memory_step_leaves_the_run_as_it_would_be(tmp_path, caplog, monkeypatch):
    plain = _train()
    original_backward = torch.autograd.backward

    def broken(self):
        raise RuntimeError("a module this probe does not know")

    monkeypatch.setattr(MemoryStepMarks, "forward_begin", broken)
    trackers = []
    with caplog.at_level(logging.WARNING, logger="ckptbench"):
        tracked = _train(tmp_path / "records", before=trackers.append)
    _same(plain, tracked)
    t = trackers[0]
    assert t.session.failed.startswith("RuntimeError in _forward_pre: a module this probe does not know")
    assert t._handles == [] and torch.autograd.backward is original_backward  # every hook and patch gone
    warned = [r.getMessage() for r in caplog.records if r.name == "ckptbench"]
    assert len([w for w in warned if "stopped measuring" in w]) == 1


def test_a_trainer_whose_probe_fails_trains_as_it_would_untracked(tmp_path, monkeypatch):
    from transformers import Trainer, TrainingArguments

    def run(callback=None):
        model = _model()
        data = [{"input_ids": ids[0], "labels": ids[0]} for ids in _batches()]
        args = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=STEPS, per_device_train_batch_size=1,
                                 learning_rate=1e-3, lr_scheduler_type="constant", report_to="none",
                                 disable_tqdm=True, save_strategy="no", use_cpu=True, dataloader_pin_memory=False,
                                 seed=0, data_seed=0, logging_steps=1)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        if callback is not None:
            trainer.add_callback(callback)
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        return trainer, losses, [p.detach().clone() for p in model.parameters()]

    _, plain_losses, plain_params = run()

    def broken(self):
        raise RuntimeError("probe failed")

    monkeypatch.setattr(MemoryStepMarks, "forward_begin", broken)
    callback = TrainerTracker(out=str(tmp_path / "records"), echo=False)
    trainer, losses, params = run(callback)
    assert losses == plain_losses and all(torch.equal(a, b) for a, b in zip(params, plain_params))
    assert len(losses) == STEPS
    assert callback.session.failed == "RuntimeError in broken: probe failed"  # the probe that raised, by name
    assert callback._restore is None and trainer.compute_loss.__func__ is Trainer.compute_loss  # its own again


def test_a_tracked_trainer_run_prints_nothing_but_ckptbenchs_note(tmp_path):
    """fd 1 and 2 of the Trainer example, captured by the subprocess: no profiler USDT line, no allocator
    warning; its stderr is ckptbench's one note (the Trainer's own loss logs are on stdout, as untracked)."""
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "trainer_checkpointing.py"), "--out",
                           str(tmp_path / "records"), "--steps", "20"], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    both = proc.stdout + proc.stderr
    assert "USDT" not in both and "profiler_start" not in both and "CPUAllocator" not in both
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and all(line.startswith("ckptbench: ") for line in lines), lines


def test_transformers_lines_of_ckptbenchs_own_model_copies_stay_off_the_terminal(tmp_path, capfd):
    """With transformers at INFO (as a user may set it), building the estimate's copies of the model
    would print their configs; those lines are ckptbench's, not the run's: kept off, the level put back."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_info()
    try:
        _train(tmp_path / "records")
        err = capfd.readouterr().err
        assert hf_logging.get_verbosity() == hf_logging.INFO
    finally:
        hf_logging.set_verbosity(level)
    assert "GenerationConfig" not in err and "[transformers]" not in err, err
    records = (tmp_path / "records" / "records.jsonl").read_text().splitlines()
    assert len(records) == 1
