"""A suite for the user's own model: a config.json on disk, a hub name from the Hugging Face cache
(offline: nothing is downloaded), a model_type with dimensions; shrunk by overrides, run end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ckptbench.store.records import load_records
from ckptbench.suite.keys import SuiteError
from ckptbench.suite.parse import load_suite, parse_suite

pytestmark = pytest.mark.e2e

# The public config.json of mistralai/Mistral-7B-v0.1 (values as published), shrunk by the suite below
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000,
}
SHRINK = """
hidden = 64
layers = 2
heads = 4
kv_heads = 2
intermediate = 128
vocab = 256
[train]
warmup_steps = 1
memory_steps = 1
steps = 1
max_steps = 1
[sweep]
batch_size = [2]
seq_len = [32]
every_n_layers = [0, 1]
"""


def _run(suite_path: str, out: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", suite_path, "--out", out],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def _check_run(out: str) -> None:
    records = load_records(out).records
    assert [r["status"] for r in records] == ["ok", "ok"]
    for r in records:
        assert r["case"]["model"]["family"] == "mistral"
        assert json.loads(r["case"]["model"]["config"])["sliding_window"] == 4096  # the user's key, kept
        assert r["estimate_source"] == "simulation" and r["verdict"] == "pass"


@pytest.mark.slow
def test_a_config_file_suite_runs_the_users_architecture_shrunk(tmp_path):
    (tmp_path / "mistral").mkdir()
    (tmp_path / "mistral" / "config.json").write_text(json.dumps(MISTRAL_7B))
    suite = tmp_path / "mine.toml"
    suite.write_text('[suite]\nname = "mine"\n[model]\nconfig = "mistral"\n' + SHRINK)  # beside the suite
    spec = load_suite(str(suite)).cases[0].model
    assert (spec.family, spec.hidden, spec.layers, spec.vocab, spec.name) == ("mistral", 64, 2, 256, "mistral")
    proc = _run(str(suite), str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    _check_run(str(tmp_path / "run"))


@pytest.mark.slow
def test_a_hub_suite_reads_the_cached_config_offline_and_names_what_is_missing(tmp_path):
    cache = tmp_path / "hub"
    snapshot = cache / "models--mistralai--Mistral-7B-v0.1" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(MISTRAL_7B))
    (cache / "models--mistralai--Mistral-7B-v0.1" / "refs").mkdir()
    (cache / "models--mistralai--Mistral-7B-v0.1" / "refs" / "main").write_text("abc123")
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    suite = tmp_path / "hub.toml"
    suite.write_text('[suite]\nname = "hub"\n[model]\nhub = "mistralai/Mistral-7B-v0.1"\n' + SHRINK)
    proc = _run(str(suite), str(tmp_path / "run"), env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _check_run(str(tmp_path / "run"))

    missing = tmp_path / "missing.toml"
    missing.write_text('[suite]\nname = "x"\n[model]\nhub = "someone/not-cached"\n' + SHRINK)
    proc = _run(str(missing), str(tmp_path / "never"), env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {missing}: model.hub: hub model 'someone/not-cached'")
    assert "hf download someone/not-cached config.json" in line


def test_model_sources_are_validated_in_one_line():
    with pytest.raises(SuiteError) as err:
        parse_suite('[model]\nmodel_type = "not-a-model"\nhidden = 8\nlayers = 1\nheads = 1\nintermediate = 8\n'
                    'vocab = 8\n[sweep]\nbatch_size = [1]\nseq_len = [4]\n', "x.toml")
    assert err.value.key == "model.model_type" and "knows no causal LM of model_type 'not-a-model'" in err.value.reason
    with pytest.raises(SuiteError) as err:
        parse_suite('[model]\npreset = "llama-tiny"\nhub = "a/b"\n[sweep]\nbatch_size = [1]\nseq_len = [4]\n', "x.toml")
    assert err.value.key == "model.hub" and "one model source" in err.value.reason
    with pytest.raises(SuiteError) as err:
        parse_suite('[model]\nconfig = "/nonexistent/config.json"\n[sweep]\nbatch_size = [1]\nseq_len = [4]\n',
                    "x.toml")
    assert err.value.key == "model.config" and "cannot read" in err.value.reason
