"""Model presets: the real architectures' sizes, counted on the meta device, and the quick sweep form."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ckptbench.point.case import PRESETS, preset
from ckptbench.theory.memory.params import param_count
from ckptbench.train.models import build_model


def _meta_count(name: str) -> int:
    with torch.device("meta"):
        model = build_model(preset(name), "meta")
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", [n for n in PRESETS if preset(n).analytic])
def test_the_analytic_parameter_count_equals_the_built_models(name):
    assert param_count(preset(name)).total == _meta_count(name)


def test_published_sizes_of_presets_without_an_analytic_count():
    # totals of the published checkpoints (safetensors index total_size / 2 bytes for bf16 weights)
    assert _meta_count("mistral-7b") == 7_241_732_096
    assert _meta_count("pythia-160m") == 162_322_944
    assert round(_meta_count("mixtral-8x7b") / 1e9, 1) == 46.7
    assert round(_meta_count("gemma2-2b") / 1e9, 2) == 2.61


def test_models_lists_every_preset():
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "models"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    listed = {line.split()[0] for line in proc.stdout.splitlines()[1:-1]}
    assert listed == set(PRESETS)
    assert "mistral-7b     mistral          32   4096     7.24B  simulation" in proc.stdout


@pytest.mark.slow
def test_quick_form_writes_its_suite_and_a_rerun_of_it_resumes(tmp_path):
    out = tmp_path / "run"
    quick = [sys.executable, "-m", "ckptbench", "sweep", "--model", "mistral-7b", "--layers", "2", "--hidden", "64",
             "--vocab", "256", "--seq", "32", "--batch", "2", "--every-n-layers", "0,1", "--max-steps", "3",
             "--out", str(out)]
    proc = subprocess.run(quick, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (out / "suite.toml").read_text()
    assert 'preset = "mistral-7b"' in text and "layers = 2" in text and "every_n_layers = [0, 1]" in text
    assert "max_steps = 3" in text
    assert (out / "report.html").is_file()  # a quick sweep ends with its report
    again = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", str(out / "suite.toml"), "--out",
                            str(out), "--resume"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "resume: 2 cases already in" in again.stderr
    both = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--model", "x", "--suite", "y"],
                          capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "give --suite FILE, or --model NAME" in both.stderr


@pytest.mark.slow
def test_quick_form_names_its_run_a_plain_directory_name_whatever_the_model_path(tmp_path, monkeypatch):
    from ckptbench.cli.quick import run_name

    here = tmp_path / "My Model (v2)"
    here.mkdir()
    (here / "config.json").write_text('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, '
                                      '"num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256}')
    monkeypatch.chdir(here)
    assert [run_name(m) for m in (".", "../My Model (v2)/", "config.json", "org/Llama-3.1-8B", "llama-tiny",
                                  "..", "x" * 200)] == [
        "My_Model_v2-quick", "My_Model_v2-quick", "config.json-quick", "Llama-3.1-8B-quick", "llama-tiny-quick",
        f"{tmp_path.name}-quick", "x" * 94 + "-quick"]
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--model", ".", "--seq", "16", "--dry-run"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_estimate_of_a_model_without_an_analytic_estimate_is_its_simulated_step():
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "estimate", "--model", "mistral-7b", "--batch", "1",
                           "--seq", "1024", "--dtype", "bf16", "--every-n-layers", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines()[1:]}
    assert float(lines["params_bytes"]) == round(7_241_732_096 * 2 / 2**30, 3)  # bf16 weights
    assert float(lines["checkpointed_input_bytes"]) == 0.25  # 32 layers x 1 x 1024 x 4096 x 2 bytes


def test_the_listed_preset_sizes_are_those_of_the_built_models():
    """`ckptbench models` lists sizes without building anything: the table must be the built models'."""
    import torch

    from ckptbench.point.case import PRESETS, preset
    from ckptbench.point.preset_sizes import PARAMS
    from ckptbench.train.models import build_model

    assert set(PARAMS) == set(PRESETS), "run scripts/preset_sizes.py after adding or removing a preset"
    for name in PRESETS:
        with torch.device("meta"):
            model = build_model(preset(name), "meta")
        assert PARAMS[name] == sum(p.numel() for p in model.parameters()), f"{name}: run scripts/preset_sizes.py"


def test_the_checkpointing_method_read_from_the_source_is_the_one_the_class_has():
    from transformers import PreTrainedModel

    from ckptbench.train.environment import checkpointing_api

    assert hasattr(PreTrainedModel, checkpointing_api())
    assert (checkpointing_api() == "activation_checkpointing_enable") == hasattr(
        PreTrainedModel, "activation_checkpointing_enable")


def test_a_quick_sweep_compares_none_every_other_layer_and_full_by_default():
    from ckptbench.cli import build_parser
    from ckptbench.cli.sweep import _suite

    def strategies(*flags):
        args = build_parser().parse_args(["sweep", "--model", "llama-tiny", "--seq", "32", *flags])
        return [c.strategy for c in _suite(args).cases]

    assert strategies() == ["none+bf16-mixed", "every-2+bf16-mixed", "full+bf16-mixed"]
    assert strategies("--layers", "1") == ["none+bf16-mixed", "full+bf16-mixed"]  # no "every other" of one layer
    assert strategies("--every-n-layers", "1", "--precision", "fp32") == ["full"]
    # on CUDA offload moves the checkpointed inputs to the host: each checkpointed setting with it too
    assert strategies("--device", "cuda", "--attn", "eager") == [
        "none+bf16-mixed", "every-2+bf16-mixed", "every-2+offload+bf16-mixed", "full+bf16-mixed",
        "full+offload+bf16-mixed"]
