"""A tracked run's figures where the user already looks: Trainer's ``report_to`` (TensorBoard event files
read back) and ``accelerator.log``; and the training a tracker measures is the training untracked."""

from __future__ import annotations

import pathlib

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

from ckptbench.point.training import Timing, TrainSpec
from ckptbench.track import TrainerTracker, track

pytestmark = pytest.mark.e2e
STEPS = 12
KEYS = {"ckptbench/peak_gib", "ckptbench/step_s", "ckptbench/tokens_per_s", "ckptbench/checkpointed_layers",
        "ckptbench/peak_estimate_error"}


def _model(every_n_layers=1):
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, intermediate_size=64, vocab_size=128,
                                  max_position_embeddings=64, tie_word_embeddings=False, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False},
                                          every_n_layers=every_n_layers)
    return model


def _rows():
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (STEPS, 16), generator=g)]


def _trainer(out: pathlib.Path, callback=None, report_to="none"):
    model = _model()
    args = TrainingArguments(output_dir=str(out / "trainer"), max_steps=STEPS,
                             per_device_train_batch_size=1, learning_rate=1e-3, lr_scheduler_type="constant",
                             report_to=report_to, disable_tqdm=True, save_strategy="no", use_cpu=True,
                             dataloader_pin_memory=False, seed=0, data_seed=0, logging_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=_rows())
    if callback is not None:
        trainer.add_callback(callback)
    trainer.train()
    return trainer


def test_trainer_hands_the_figures_to_tensorboard_and_trains_as_untracked(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plain = _trainer(tmp_path / "plain")
    # at most 3 timed steps: the measurement ends at step 5 of 12, a step the Trainer logs (logging_steps=1),
    # so handing the figures over must leave that step's loss in the logs
    callback = TrainerTracker(out=str(tmp_path / "records"), echo=False, train=TrainSpec(timing=Timing(max_steps=3)))
    tracked = _trainer(tmp_path / "tracked", callback, report_to="tensorboard")
    assert callback.session.k < STEPS
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (plain, tracked)]
    assert len(losses[0]) == STEPS and losses[0] == losses[1]
    assert all(torch.equal(a, b) for a, b in zip(plain.model.parameters(), tracked.model.parameters()))
    record = callback.record
    assert record["status"] == "ok"
    runs = [p.parent for p in (tmp_path / "tracked" / "trainer").rglob("events.out.tfevents.*")]  # output_dir/runs
    assert runs
    acc = EventAccumulator(str(runs[0]))
    acc.Reload()
    tags = {t.removeprefix("train/") for t in acc.Tags()["scalars"]}
    assert KEYS <= tags
    m = record["measurement"]
    peak = next(t for t in acc.Tags()["scalars"] if t.endswith("ckptbench/peak_gib"))
    assert acc.Scalars(peak)[0].value == pytest.approx(m["peak_bytes"] / 2**30, rel=1e-6)
    layers = next(t for t in acc.Tags()["scalars"] if t.endswith("ckptbench/checkpointed_layers"))
    assert acc.Scalars(layers)[0].value == len(m["checkpointed_layers"]) == 2


def test_accelerator_log_hands_the_figures_to_tensorboard_and_the_loop_trains_as_untracked(tmp_path):
    pytest.importorskip("tensorboard")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def run(tracked: bool):
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        project = tmp_path / ("tracked" if tracked else "plain")
        accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(project))
        accelerator.init_trackers("run")
        model = _model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer = accelerator.prepare(model, optimizer)
        losses = []

        def one(row):
            ids = row["input_ids"][None]
            loss = model(input_ids=ids, labels=ids).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())

        if tracked:
            with track(model, optimizer, out=str(tmp_path / "records"), echo=False, accelerator=accelerator) as t:
                for row in _rows():
                    with t.step(row["input_ids"][None]):
                        one(row)
        else:
            for row in _rows():
                one(row)
        accelerator.end_training()
        return losses, [p.detach().clone() for p in model.parameters()], project, t if tracked else None

    plain = run(False)
    losses, params, project, t = run(True)
    assert losses == plain[0] and all(torch.equal(a, b) for a, b in zip(params, plain[1]))
    assert t.record["status"] == "ok"
    runs = sorted({p.parent for p in project.rglob("events.out.tfevents.*")})
    assert runs
    acc = EventAccumulator(str(runs[0]))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == KEYS
    (event,) = acc.Scalars("ckptbench/peak_gib")
    assert event.step == t.session.k and event.value == pytest.approx(t.record["measurement"]["peak_bytes"] / 2**30,
                                                                      rel=1e-6)
