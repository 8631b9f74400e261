"""A suite that names no attention runs what transformers builds without being told; one that names it
keeps it.  The point's id is the attention that runs, so an unnamed default and the same attention named
are the same point."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptbench.sources.configs import SDPA_FAMILIES, default_attention, model_class, model_class_here
from ckptbench.suite.parse import load_suite, parse_suite

ROOT = Path(__file__).resolve().parents[2]
SWEEP = "[sweep]\nbatch_size = [1]\nseq_len = [32]\nevery_n_layers = [0, 1]\n"


def _suite(model: str, device: str = "cpu"):
    return parse_suite(f'[suite]\ndevice = "{device}"\n[model]\n{model}\n{SWEEP}', "x.toml")


def test_no_attention_named_is_transformers_default_and_the_same_point_as_naming_it():
    unnamed = _suite('preset = "llama-tiny"')
    assert {c.model.attn for c in unnamed.cases} == {"sdpa"}
    assert unnamed.attn_note == "sdpa: transformers' default for llama (the suite names no attention)"
    named = _suite('preset = "llama-tiny"\nattn = "sdpa"')
    assert named.attn_note == "" and [c.id for c in named.cases] == [c.id for c in unnamed.cases]
    eager = _suite('preset = "llama-tiny"\nattn = "eager"')
    assert {c.model.attn for c in eager.cases} == {"eager"} and eager.attn_note == ""
    assert not {c.id for c in eager.cases} & {c.id for c in unnamed.cases}


@pytest.mark.parametrize("name,attn", [("cpu", "eager"), ("smoke", "eager"), ("gpu-small", "sdpa"),
                                       ("localsgd-cpu", "eager"), ("gpu-8b", "sdpa")])
def test_shipped_suites_keep_the_attention_they_name(name, attn):
    suite = load_suite(str(ROOT / "suites" / f"{name}.toml"))
    assert {c.model.attn for c in suite.cases} == {attn} and suite.attn_note == ""


def test_fp32_on_cuda_defaults_to_eager_and_says_why():
    fp32 = _suite('preset = "llama-tiny"', device="cuda")
    assert {c.model.attn for c in fp32.cases} == {"eager"}
    assert "math kernel" in fp32.attn_note  # the fused kernels the estimate models do not all take fp32
    bf16 = _suite('preset = "llama-tiny"\ndtype = "bf16"', device="cuda")
    assert {c.model.attn for c in bf16.cases} == {"sdpa"}


def test_default_attention_follows_the_class():
    assert default_attention("gemma2", "cpu", "fp32", supports_sdpa=False)[0] == "eager"
    assert default_attention("mistral", "cuda", "bf16", supports_sdpa=True)[0] == "sdpa"


@pytest.mark.parametrize("family", SDPA_FAMILIES)
def test_the_families_answered_without_asking_transformers_do_support_sdpa(family):
    """The analytic families are answered without a child interpreter; transformers must agree."""
    assert model_class(family) == model_class_here(family)
    assert model_class_here(family).supports_sdpa
