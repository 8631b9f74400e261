"""ckptbench.track on real runs: the example scripts' records equal the sweep's measurement of the same Case
to the byte, a run_clm-shaped script gets a record and a report from one added line, and each named mistake
is made on purpose and named."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest
import torch

from ckptbench.point.case import Case, preset
from ckptbench.point.setup import Lora, Setup
from ckptbench.point.training import TrainSpec
from ckptbench.run.launch import flatten_measurement, run_distributed_cases
from ckptbench.run.worker import measure
from ckptbench.store.records import load_records

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_accelerate")]

ROOT = pathlib.Path(__file__).resolve().parents[2]
MEMORY = ("peak_bytes", "mem_after_forward_bytes", "peak_breakdown", "peak_phase", "params_bytes",
          "optimizer_bytes", "activations_after_forward_bytes")


def example(name: str, directory: pathlib.Path = ROOT / "examples"):
    spec = importlib.util.spec_from_file_location(f"example_{name}", directory / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def the_sweeps(record: dict) -> dict:
    """What the sweep's worker measures for the record's Case (the same code a sweep point runs)."""
    return measure(Case.from_dict(record["case"]))


def assert_same_memory(record: dict) -> None:
    assert record["status"] == "ok" and record["verdict"] == "pass", record.get("checks")
    swept = the_sweeps(record)
    assert {k: record["measurement"][k] for k in MEMORY} == {k: swept[k] for k in MEMORY}


def test_trainer_example_is_the_sweeps_point_to_the_byte(tmp_path):
    record = example("trainer_checkpointing").main(["--out", str(tmp_path), "--steps", "6"])
    # the Case read from the Trainer, its model and its arguments is the one a suite names
    expected = Case(model=preset("llama-tiny"), train=TrainSpec(threads=torch.get_num_threads()), batch_size=2,
                    seq_len=64, every_n_layers=2, setup=Setup(autocast="bf16", loop="trainer"))
    assert record["case_id"] == expected.id
    assert record["strategy"] == "every-2+bf16-mixed+trainer"
    assert record["measurement"]["checkpointed_layers"] == [0, 2]
    assert_same_memory(record)
    assert load_records(str(tmp_path)).records[0]["case_id"] == expected.id  # written, and valid when read


def test_accelerate_lora_example_is_the_sweeps_point_to_the_byte(tmp_path):
    record = example("accelerate_lora").main(["--out", str(tmp_path), "--steps", "6"])
    expected = Case(model=preset("llama-tiny"), train=TrainSpec(threads=torch.get_num_threads()), batch_size=2,
                    seq_len=64, every_n_layers=1,
                    setup=Setup(loop="accelerate", lora=Lora(r=8, alpha=16, targets=("q_proj", "v_proj"))))
    assert record["case_id"] == expected.id
    assert record["estimate_source"] == "simulation"  # LoRA: the simulation of the peft-wrapped step
    assert record["measurement"]["recomputed_layers"] == [0, 1, 2, 3]
    assert_same_memory(record)


HEAD_DIM_128 = ("hidden_size=256,num_hidden_layers=2,num_attention_heads=2,num_key_value_heads=2,"
                "intermediate_size=512,vocab_size=256")


@pytest.mark.parametrize("overrides", [None, HEAD_DIM_128], ids=["script-default", "head-dim-128"])
def test_run_clm_shaped_script_gets_a_record_and_a_report(tmp_path, overrides):
    out = tmp_path / "clm"
    script = ROOT / "tests" / "e2e" / "track_scripts" / "run_clm_like.py"
    done = subprocess.run([sys.executable, str(script), "--output_dir", str(tmp_path / "trainer"),
                           "--ckptbench_out", str(out), "--max_steps", "8",
                           *(["--config_overrides", overrides] if overrides else [])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = load_records(str(out)).records
    assert [r["status"] for r in records] == ["ok"]
    assert records[0]["case"]["every_n_layers"] == 1 and records[0]["track"]["use_reentrant"] is False
    # TrainingArguments' default optim (adamw_torch_fused) is the fused AdamW, named and judged as what ran:
    # named the per-parameter AdamW, the head-dim-128 point's peak had been put in the optimizer step
    assert records[0]["case"]["setup"]["optimizer"] == "adamw-fused"
    assert records[0]["measurement"]["optimizer"]["implementation"] == "fused"
    assert records[0]["verdict"] == "pass", records[0]["checks"]
    report = subprocess.run([sys.executable, "-m", "ckptbench", "report", str(out), "-o",
                             str(tmp_path / "report.html")], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    assert (tmp_path / "report.html").stat().st_size > 10_000
    csv = subprocess.run([sys.executable, "-m", "ckptbench", "report", str(out), "--csv", str(tmp_path / "r.csv")],
                         capture_output=True, text=True, timeout=300)
    assert csv.returncode == 0, csv.stderr[-3000:]
    assert records[0]["case_id"] in (tmp_path / "r.csv").read_text()


def test_every_record_line_is_the_sweeps_schema(tmp_path):
    example("trainer_checkpointing").main(["--out", str(tmp_path), "--steps", "6"])
    line = json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])
    assert line["schema"] == 1 and line["suite"].startswith("track:")
    assert {"case_id", "case", "status", "measurement", "checks", "verdict", "env", "track"} <= set(line)


def test_torchrun_example_writes_one_record_per_rank(tmp_path):
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           str(ROOT / "examples" / "torchrun_plain.py"), "--out", str(tmp_path), "--steps", "8"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # the run's directory reads as both ranks' records (rank 0's file and rank-1/'s), each one of its own
    r0, r1 = load_records(str(tmp_path)).records
    assert load_records(str(tmp_path / "rank-1")).records == [r1]
    assert r0["case"]["world_size"] == 2 and r0["strategy"] == "full+ddp2" and r1["track"]["rank"] == 1
    assert r0["status"] == r1["status"] == "ok" and r0["verdict"] == "pass", r0["checks"]
    # each rank's step is the one-process sweep point's, to the byte, plus DDP's gradient buckets (one bucket
    # of every trainable byte on llama-tiny), counted from the backward's first write: the peak is judged so
    case = Case.from_dict(r0["case"])
    alone = measure(dataclasses.replace(case, world_size=1))
    for record in (r0, r1):
        m = record["measurement"]
        assert m["ddp_bucket_bytes"] == alone["params_bytes"] - 64 == 723_200  # all but the rotary inv_freq buffer
        assert m["mem_after_forward_bytes"] == alone["mem_after_forward_bytes"]
        assert m["peak_bytes"] == alone["peak_bytes"] + m["ddp_bucket_bytes"]
        assert m["peak_breakdown"]["activations"] == alone["peak_breakdown"]["activations"] + m["ddp_bucket_bytes"]
        assert m["peak_phase"] == alone["peak_phase"]
        peak = next(c for c in record["checks"] if c["quantity"] == "peak_bytes")
        assert peak["verdict"] == "pass" and peak["difference"] == 0, peak
        assert record["meters"]["agreement"] == "agree", record["meters"]
    # and the sweep's own two-rank DDP point of the same Case measures each rank's step the same way: the same
    # after-forward, phase and buckets; its loop is Accelerate's, whose backward holds the loss one fp32 scalar
    # longer (4 B, as one process: test_precision_loops.py::test_accelerate_divides_the_loss_inside_backward)
    sweep = run_distributed_cases([case], str(tmp_path / "sweep"), 600)[0]
    assert sweep["status"] == "ok", sweep["reason"]
    flat = flatten_measurement(case, sweep["measurement"])
    tracked = r0["measurement"]
    for q in ("mem_after_forward_bytes", "peak_phase", "ddp_bucket_bytes"):
        assert flat[q] == tracked[q], q
    assert flat["peak_bytes_per_rank"] == [tracked["peak_bytes"] + 4] * 2
    assert flat["peak_breakdown"] == {**tracked["peak_breakdown"],
                                      "activations": tracked["peak_breakdown"]["activations"] + 4}


def test_dynamic_padding_records_the_batches_measured_and_is_judged_with_the_memory_steps_mask(tmp_path):
    """Batches padded to their longest row (the warm-up 40 tokens, every later step 64, the memory step's
    mask padding 10 of them): the Case is the memory step's batch, each shape counted, both named."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ckptbench.track import track

    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                  max_position_embeddings=256, tie_word_embeddings=False, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def padded(length: int, pad: int) -> dict:
        ids = torch.randint(0, 256, (2, length))
        mask = torch.ones(2, length, dtype=torch.long)
        mask[1, length - pad:] = 0
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    batches = [padded(40, 0)] + [padded(64, 10) for _ in range(7)]
    with track(model, optimizer, out=str(tmp_path), echo=False) as t:
        for batch in batches:
            with t.step(batch):
                model(**batch).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    record = t.record
    assert record["status"] == "ok"
    assert (record["case"]["batch_size"], record["case"]["seq_len"]) == (2, 64)
    seen = record["track"]["batches"]
    assert seen["memory"] == [2, 64] and seen["shapes"]["2x40"] == 1 and set(seen["shapes"]) == {"2x40", "2x64"}
    unknown = " ".join(record["track"]["unknown"])
    assert "2 shapes (dynamic padding)" in unknown
    # the mask is modelled: the step is simulated with one padding 10 tokens (sdpa builds a 4-D mask from it)
    measured = record["measurement"]
    assert measured["batch_padded_tokens"] == 10 and "pads 10 tokens" in record["estimate_note"]
    assert record["estimate_source"] == "simulation" and record["verdict"] == "pass", record["checks"]
    # to the byte but for the loop's labels, a tensor of their own (2 x 64 int64) where the simulated loop's
    # labels are its input_ids
    for key in ("peak_bytes", "mem_after_forward_bytes"):
        assert measured[key] - measured["simulation"][key] == 2 * 64 * 8, key
    assert measured["peak_phase"] == measured["simulation"]["peak_phase"]


@pytest.mark.parametrize("pad", [0, 10], ids=["mask-of-ones", "padded"])
def test_a_trainer_whose_collator_gives_an_attention_mask_is_simulated_with_it_to_the_byte(tmp_path, pad):
    """A tokenized dataset's ``attention_mask`` reaches the model through the Trainer: of all ones it is a
    tensor of the batch the model skips, padding it makes sdpa build its 4-D mask; either way the record
    equals the simulated step with that mask, to the byte."""
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    from ckptbench.track import TrainerTracker

    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                  max_position_embeddings=256, tie_word_embeddings=False, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(24):
        ids = torch.randint(0, 256, (64,), generator=g)
        mask = torch.ones(64, dtype=torch.long)
        mask[64 - pad:] = 0
        data.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=12, per_device_train_batch_size=2,
                             learning_rate=1e-3, report_to="none", disable_tqdm=True, save_strategy="no",
                             use_cpu=True, dataloader_pin_memory=False, seed=0, logging_steps=100)
    callback = TrainerTracker(out=str(tmp_path / "records"), echo=False)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.add_callback(callback)
    trainer.train()
    record = callback.record
    measured = record["measurement"]
    assert record["verdict"] == "pass" and measured["batch_padded_tokens"] == 2 * pad
    for key in ("peak_bytes", "mem_after_forward_bytes", "peak_phase"):
        assert measured[key] == measured["simulation"][key], key
    assert ("pads 20 tokens" in record.get("estimate_note", "")) == bool(pad)
